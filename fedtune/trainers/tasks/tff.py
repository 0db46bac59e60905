"""TFF-style HDF5 loaders: ``emnist``, ``cifar100``, ``shakespeare_tff``, ``stackoverflow_tp``,
``stackoverflow_nwp`` (the datasets of Charles & Konečný 2021 (arXiv:2103.05032) /
Charles & Konečný 2020 (arXiv:2007.00878)).

Format (TFF's ``fed_emnist*.h5``, ``fed_cifar100_*.h5``, ``shakespeare_*.h5``,
``stackoverflow_*.h5``): one dataset per client and feature, ``examples/<client_id>/<feature>``,
all features of a client with the same leading length. Clients are ordered by id and the first
``max_clients`` kept; the test file (``test_path``) is selected as in
:func:`~fedtune.trainers.tasks.leaf.select_test_clients`. Nothing is downloaded. With
``lazy: true`` the training clients stay in the file and each cohort's groups are read when the
engine asks for them (:class:`~fedtune.trainers.tasks.hdf5.HDF5ClientData`; vocabularies and
client sizes come from one streamed pass at load time); the test split stays pooled in memory.

* ``emnist``: ``pixels`` float [n, 28, 28] → ``[n, 1, 28, 28]`` unchanged; ``label`` in
  0..classes−1 (62, or 10 for the digits-only files).
* ``cifar100``: ``image`` uint8 [n, 32, 32, 3] → centre crop ``crop``×``crop`` → per-image
  standardisation (x − mean)/max(std, 1/√(#values)) → ``[n, 3, crop, crop]``. The papers' random
  crop and random horizontal flip are per-step augmentations; they are **not applied** (the
  trainer's data are fixed tensors), the deterministic centre crop stands in for the crop.
* ``shakespeare_tff``: each ``snippets`` string → ``[bos] + chars + [eos]`` cut into windows of
  ``seq_len + 1`` (input = window[:-1], target = window[1:]).
* ``stackoverflow_tp``: ``tokens`` (space-separated) → bag of words over the ``vocab_size`` most
  frequent words of the loaded training clients, normalised to sum 1; ``tags`` ('|'-separated)
  → multi-hot over the ``num_tags`` most frequent tags. Loss: mean over tags of the binary
  cross-entropy (one-vs-rest logistic regression, Charles & Konečný 2020 App. C). Metric:
  **precision@5** (fraction of the 5 top-scored tags that are true; chosen over recall@5
  because it is defined for posts whose tags are all outside the top ``num_tags``).
* ``stackoverflow_nwp``: first ``max_examples_per_client`` (128) posts, ``[bos] + words + [eos]``
  truncated/padded to 21 symbols → 20-token input and target; accuracy ignores pad/oov/bos/eos.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.errors import DataError
from fedtune.trainers.models import build_model
from fedtune.trainers.typed import from_mapping

from .base import Dataset, FederatedData, LossFn, Task
from .hdf5 import Convert, HDF5ClientData, Raw, read_clients, truncate
from .leaf import select_test_clients
from .losses import accuracy, cross_entropy
from .params import (
    Cifar100Params,
    EmnistParams,
    ShakespeareTffParams,
    StackOverflowNwpParams,
    StackOverflowTpParams,
    TffParams,
)
from .text import (
    SHAKESPEARE_VOCAB,
    Vocab,
    bag_of_words,
    char_windows,
    most_frequent,
    multi_hot,
    multilabel_bce,
    precision_at_k,
    sequence_accuracy,
    sequence_cross_entropy,
    word_sequence,
)

__all__ = [
    "Cifar100Params",
    "EmnistParams",
    "HDF5ClientData",
    "ShakespeareTffParams",
    "StackOverflowNwpParams",
    "StackOverflowTpParams",
    "TffParams",
    "read_clients",
    "standardize_images",
]


def _strings(values: np.ndarray) -> list[str]:
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in values.tolist()]


def _count(raws: Iterable[Raw], feature: str, sep: str | None) -> Counter[str]:
    """Token counts of ``feature`` over all clients (one pass; see text.count_tokens)."""
    counts: Counter[str] = Counter()
    for raw in raws:
        for text in _strings(raw[feature]):
            counts.update(t for t in text.split(sep) if t)
    return counts


def standardize_images(images: np.ndarray, crop: int) -> np.ndarray:
    """uint8 ``[n, H, W, C]`` → centre crop → per-image standardisation → float32 ``[n, C, c, c]``."""
    top, left = (images.shape[1] - crop) // 2, (images.shape[2] - crop) // 2
    x = images[:, top : top + crop, left : left + crop, :].astype(np.float32)
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    floor = 1.0 / np.sqrt(x[0].size)
    std = np.maximum(x.std(axis=(1, 2, 3), keepdims=True), floor)
    out = ((x - mean) / std).astype(np.float32)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2))


Prepare = Callable[[Iterable[Raw]], Any]


def _load(
    p: TffParams,
    features: Sequence[str],
    make_convert: Callable[[Any], Convert],
    prepare: Prepare | None = None,
    rows_are_examples: bool = True,
):
    """Train :class:`FederatedData` and pooled test :class:`Dataset` (or ``None``).

    ``prepare(train raws)`` runs before conversion (one pass, e.g. to build vocabularies) and
    ``make_convert(its result)`` gives the per-client conversion. ``lazy``: the clients stay in
    the file (:class:`~fedtune.trainers.tasks.hdf5.HDF5ClientData`)."""
    train_path, limit = Path(p.train_path), p.max_examples_per_client
    if p.lazy:
        train: FederatedData = HDF5ClientData.index(
            train_path, features, p.max_clients, limit, prepare, make_convert, rows_are_examples
        )
        convert = train.convert  # type: ignore[attr-defined]
    else:
        ids, raws = read_clients(train_path, features, lambda ids: ids[: p.max_clients])
        raws = [truncate(r, limit) for r in raws]
        convert = make_convert(prepare(raws) if prepare is not None else None)
        train = _in_memory(train_path, ids, raws, convert)
    if p.test_path is None:
        return train, None
    test_path = Path(p.test_path)
    kept = list(train.client_ids)
    tids, traws = read_clients(
        test_path, features, lambda all_ids: select_test_clients(all_ids, kept, p.max_clients)
    )
    parts = [
        convert(test_path, cid, truncate(r, limit)) for cid, r in zip(tids, traws, strict=True)
    ]
    parts = [(x, y) for x, y in parts if len(x)]
    if not parts:
        return train, None
    test = Dataset(
        torch.from_numpy(np.concatenate([x for x, _ in parts])),
        torch.from_numpy(np.concatenate([y for _, y in parts])),
    )
    return train, test


def _in_memory(path: Path, ids: list[str], raws: list[Raw], convert: Convert) -> FederatedData:
    clients = []
    for cid, raw in zip(ids, raws, strict=True):
        x, y = convert(path, cid, raw)
        if len(x):
            clients.append((cid, torch.from_numpy(x), torch.from_numpy(y)))
    if not clients:
        raise DataError(str(path), "no client has any example")
    return FederatedData.from_clients([(x, y) for _, x, y in clients], [c for c, _, _ in clients])


def _labels(path: Path, cid: str, labels: np.ndarray, classes: int) -> np.ndarray:
    if (
        labels.ndim != 1
        or not np.issubdtype(labels.dtype, np.integer)
        or (len(labels) and (labels.min() < 0 or labels.max() >= classes))
    ):
        raise DataError(str(path), f"client {cid!r}: 'label' must be integers in 0..{classes - 1}")
    return labels.astype(np.int64)


def _images(path: Path, cid: str, raw: np.ndarray, shape: tuple[int, ...], name: str) -> None:
    if raw.shape[1:] != shape:
        raise DataError(
            str(path),
            f"client {cid!r}: {name!r} has shape {raw.shape}; expected "
            f"[n, {', '.join(map(str, shape))}]",
        )


def _task(name: str, p: TffParams, data, shape, outputs, loss: LossFn, metrics, meta) -> Task:
    train, test = data
    return Task(
        name=name,
        train=train,
        model_fn=functools.partial(build_model, p.model, shape, outputs),
        loss_fn=loss,
        test=test,
        metric_fns=metrics,
        meta={**meta, "source": p.train_path},
    )


# Converters are module-level functions bound with functools.partial, so that a lazy store
# (which keeps its converter) pickles with the standard library.


def _convert_emnist(classes: int, path: Path, cid: str, raw: Raw):
    _images(path, cid, raw["pixels"], (28, 28), "pixels")
    x = raw["pixels"].astype(np.float32).reshape(-1, 1, 28, 28)
    return x, _labels(path, cid, raw["label"], classes)


def _convert_cifar(crop: int, classes: int, path: Path, cid: str, raw: Raw):
    _images(path, cid, raw["image"], (32, 32, 3), "image")
    return standardize_images(raw["image"], crop), _labels(path, cid, raw["label"], classes)


def _convert_shakespeare(seq_len: int, path: Path, cid: str, raw: Raw):
    vocab = SHAKESPEARE_VOCAB
    windows = [char_windows(s, seq_len, vocab) for s in _strings(raw["snippets"])]
    if not windows:
        return np.zeros((0, seq_len), np.int64), np.zeros((0, seq_len), np.int64)
    return np.concatenate([x for x, _ in windows]), np.concatenate([y for _, y in windows])


def _convert_tp(words: dict, tags: dict, vocab_size: int, num_tags: int, path, cid, raw: Raw):
    docs = [s.split() for s in _strings(raw["tokens"])]
    labels = [[t for t in s.split("|") if t] for s in _strings(raw["tags"])]
    return bag_of_words(docs, words, vocab_size), multi_hot(labels, tags, num_tags)


def _convert_nwp(vocab: Vocab, seq_len: int, path: Path, cid: str, raw: Raw):
    pairs = [word_sequence(s.split(), seq_len, vocab) for s in _strings(raw["tokens"])]
    x = np.array([a for a, _ in pairs], dtype=np.int64).reshape(-1, seq_len)
    return x, np.array([b for _, b in pairs], dtype=np.int64).reshape(-1, seq_len)


def _bind(fn, *args) -> Callable[[Any], Convert]:
    return lambda _prepared: functools.partial(fn, *args)


def build_emnist(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(EmnistParams, params, "task")
    data = _load(p, ("pixels", "label"), _bind(_convert_emnist, p.classes))
    metrics = {"accuracy": accuracy}
    return _task("emnist", p, data, (1, 28, 28), p.classes, cross_entropy, metrics, {})


def build_cifar100(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(Cifar100Params, params, "task")
    data = _load(p, ("image", "label"), _bind(_convert_cifar, p.crop, p.classes))
    shape = (3, p.crop, p.crop)
    metrics = {"accuracy": accuracy}
    return _task("cifar100", p, data, shape, p.classes, cross_entropy, metrics, {})


def build_shakespeare_tff(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(ShakespeareTffParams, params, "task")
    vocab = SHAKESPEARE_VOCAB
    convert = _bind(_convert_shakespeare, p.seq_len)
    data = _load(p, ("snippets",), convert, rows_are_examples=False)
    loss, metrics = sequence_cross_entropy(vocab.pad), {"accuracy": sequence_accuracy(vocab.pad)}
    return _task(
        "shakespeare_tff", p, data, (p.seq_len,), vocab.size, loss, metrics, {"vocab": vocab}
    )


def build_stackoverflow_tp(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(StackOverflowTpParams, params, "task")
    index: dict[str, dict[str, int]] = {}

    def prepare(raws: Iterable[Raw]) -> None:
        words: Counter[str] = Counter()
        tags: Counter[str] = Counter()
        for raw in raws:  # one pass: a lazy store streams the file once
            words.update(_count([raw], "tokens", None))
            tags.update(_count([raw], "tags", "|"))
        index["words"] = {w: i for i, w in enumerate(most_frequent(words, p.vocab_size))}
        index["tags"] = {t: i for i, t in enumerate(most_frequent(tags, p.num_tags))}

    def make_convert(_prepared) -> Convert:
        return functools.partial(
            _convert_tp, index["words"], index["tags"], p.vocab_size, p.num_tags
        )

    data = _load(p, ("tokens", "tags"), make_convert, prepare)
    metrics = {"precision_at_5": precision_at_k(5)}
    meta = {"words": tuple(index["words"]), "tags": tuple(index["tags"])}
    return _task(
        "stackoverflow_tp", p, data, (p.vocab_size,), p.num_tags, multilabel_bce, metrics, meta
    )


def build_stackoverflow_nwp(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(StackOverflowNwpParams, params, "task")

    vocabs: list[Vocab] = []

    def prepare(raws: Iterable[Raw]) -> Vocab:
        vocabs.append(Vocab(most_frequent(_count(raws, "tokens", None), p.vocab_size)))
        return vocabs[0]

    def make_convert(vocab: Vocab) -> Convert:
        return functools.partial(_convert_nwp, vocab, p.seq_len)

    data = _load(p, ("tokens",), make_convert, prepare)
    v = vocabs[0]
    metrics = {"accuracy": sequence_accuracy(v.pad, ignore=(v.oov, v.bos, v.eos))}
    return _task(
        "stackoverflow_nwp",
        p,
        data,
        (p.seq_len,),
        v.size,
        sequence_cross_entropy(v.pad),
        metrics,
        {"vocab": v},
    )
