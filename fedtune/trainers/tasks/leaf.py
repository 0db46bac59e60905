"""LEAF JSON loader (Caldas et al. 2018): tasks ``femnist`` and ``shakespeare``.

Format: a directory ``path`` with ``train/*.json`` and optionally ``test/*.json``; each file is

    {"users": [u, ...], "num_samples": [n_u, ...],
     "user_data": {u: {"x": [...], "y": [...]}, ...}}

and the users of one split may be spread over several files. Users are ordered by id and the
first ``max_clients`` are kept (no randomness: the data seed does not change a file-backed
dataset). Clients without examples are skipped. ``lazy: true`` keeps the training users in the
files and reads each cohort's byte ranges (:mod:`.leaf_store`); the test split stays pooled in
memory. The test split pools the test examples of the
kept training clients (LEAF splits each user's samples), or — when the test files share no
user with them — of the first ``max_clients`` test users.

* ``femnist``: x = 784 floats → ``float32 [1, 28, 28]`` (no preprocessing, as
  Charles & Konečný 2020 (arXiv:2007.00878) App. C), y ∈ 0..61. Default model ``femnist_cnn``.
* ``shakespeare``: x = an 80-character string, y = the next character. Input = x, target = x
  shifted by one followed by y, encoded with the 90-symbol vocabulary of
  docs/explanation/algorithms.md §7.2 (:data:`~fedtune.trainers.tasks.text.SHAKESPEARE_VOCAB`);
  loss = mean cross-entropy over non-pad positions. Default model ``char_lstm``.

Every problem with the files raises :class:`~fedtune.errors.DataError` naming the file.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedtune.errors import DataError
from fedtune.trainers.models import build_model
from fedtune.trainers.typed import from_mapping

from .base import Dataset, FederatedData, Task
from .lazy import release_freed_memory
from .leaf_store import LeafClientData, index_leaf_dir
from .losses import accuracy, cross_entropy
from .params import LeafParams, LeafShakespeareParams
from .text import SHAKESPEARE_VOCAB, next_char_example, sequence_accuracy, sequence_cross_entropy

__all__ = [
    "LeafClientData",
    "LeafParams",
    "LeafShakespeareParams",
    "load_clients",
    "read_leaf_dir",
    "select_test_clients",
]

_EXPECTED = "expected a LEAF JSON directory with train/*.json (and optionally test/*.json)"
#: one user's raw examples and the file they came from
RawUser = tuple[list, list, Path]
Examples = tuple[torch.Tensor, torch.Tensor]


def _read_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(str(file), f"cannot read as JSON ({exc}); {_EXPECTED}") from exc


def _users_of(file: Path, blob: Any) -> dict[str, RawUser]:
    if not isinstance(blob, dict) or not isinstance(blob.get("user_data"), dict):
        raise DataError(
            str(file),
            "missing key 'user_data'; expected a LEAF JSON object "
            "{'users': [...], 'num_samples': [...], 'user_data': {...}}",
        )
    data = blob["user_data"]
    users = blob.get("users", sorted(data))
    counts = blob.get("num_samples")
    if not isinstance(users, list) or (
        counts is not None and (not isinstance(counts, list) or len(counts) != len(users))
    ):
        raise DataError(
            str(file), "'users' and 'num_samples' must be lists of equal length; expected LEAF JSON"
        )
    out: dict[str, RawUser] = {}
    for k, u in enumerate(users):
        rec = data.get(u) if isinstance(u, str) else None
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("x"), list)
            or not isinstance(rec.get("y"), list)
        ):
            raise DataError(
                str(file), f"user {u!r}: expected user_data[{u!r}] = {{'x': [...], 'y': [...]}}"
            )
        if len(rec["x"]) != len(rec["y"]):
            raise DataError(
                str(file),
                f"user {u!r}: {len(rec['x'])} inputs but "
                f"{len(rec['y'])} labels; expected equal lengths",
            )
        if counts is not None and counts[k] != len(rec["x"]):
            raise DataError(
                str(file), f"user {u!r}: num_samples says {counts[k]} but x has {len(rec['x'])}"
            )
        out[u] = (rec["x"], rec["y"], file)
    return out


def read_leaf_dir(directory: Path) -> dict[str, RawUser]:
    """All users of the ``*.json`` files in ``directory`` (a user may appear in one file only)."""
    if not directory.is_dir():
        raise DataError(str(directory), f"file not found; {_EXPECTED}")
    files = sorted(directory.glob("*.json"))
    if not files:
        raise DataError(str(directory), f"no *.json files; {_EXPECTED}")
    users: dict[str, RawUser] = {}
    for file in files:
        for u, raw in _users_of(file, _read_json(file)).items():
            if u in users:
                raise DataError(
                    str(file),
                    f"user {u!r} also appears in {users[u][2]}; "
                    "expected each user in one file of a split",
                )
            users[u] = raw
    return users


def select_test_clients(
    test_ids: Sequence[str], train_ids: Sequence[str], max_clients: int | None
) -> list[str]:
    """All test clients when ``max_clients`` is unset; else those shared with the kept training
    clients, or the first ``max_clients`` (by id) when the splits share no client."""
    ordered = sorted(test_ids)
    if max_clients is None:
        return ordered
    kept = set(train_ids)
    shared = [u for u in ordered if u in kept]
    return shared or ordered[:max_clients]


def _pool(clients: list[Examples]) -> Dataset:
    return Dataset(torch.cat([x for x, _ in clients]), torch.cat([y for _, y in clients]))


def load_clients(
    root: Path,
    max_clients: int | None,
    convert: Callable[[str, RawUser], Examples],
    lazy: bool = False,
) -> tuple[FederatedData, Dataset | None]:
    """Train clients (first ``max_clients`` by id) and the pooled test split of a LEAF dir;
    ``lazy``: the training users stay in the files (:class:`LeafClientData`)."""
    if not root.is_dir():
        raise DataError(str(root), f"file not found; {_EXPECTED}")
    train: FederatedData
    if lazy:
        index = index_leaf_dir(root / "train", _EXPECTED)
        ids = [u for u in sorted(index) if index[u][3]][:max_clients]
        if not ids:
            raise DataError(str(root / "train"), "no user has any example")
        train = LeafClientData(index, ids, convert)
        del index  # the store keeps int64 arrays, not the per-user dict
        release_freed_memory()
    else:
        users = read_leaf_dir(root / "train")
        ids = [u for u in sorted(users) if users[u][0]][:max_clients]
        if not ids:
            raise DataError(str(root / "train"), "no user has any example")
        train = FederatedData.from_clients([convert(u, users[u]) for u in ids], ids)
    if not (root / "test").exists():
        return train, None
    tests = read_leaf_dir(root / "test")
    chosen = [u for u in select_test_clients(list(tests), ids, max_clients) if tests[u][0]]
    return train, (_pool([convert(u, tests[u]) for u in chosen]) if chosen else None)


def _femnist_user(user: str, raw: RawUser) -> Examples:
    xs, ys, file = raw
    try:
        x = np.asarray(xs, dtype=np.float32)
        y = np.asarray(ys)
    except (ValueError, TypeError) as exc:
        raise DataError(
            str(file), f"user {user!r}: x must be lists of 784 numbers ({exc})"
        ) from exc
    if x.ndim != 2 or x.shape[1] != 784:
        raise DataError(
            str(file),
            f"user {user!r}: x has shape {x.shape}; expected [n, 784] (28×28 pixels per example)",
        )
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() > 61:
        raise DataError(str(file), f"user {user!r}: y must be integer class ids in 0..61")
    return torch.from_numpy(x).reshape(-1, 1, 28, 28), torch.from_numpy(y.astype(np.int64))


def _shakespeare_user(seq_len: int, user: str, raw: RawUser) -> Examples:
    xs, ys, file = raw
    pairs = []
    for x, y in zip(xs, ys, strict=True):
        if not isinstance(x, str) or not isinstance(y, str) or len(y) != 1 or len(x) > seq_len:
            raise DataError(
                str(file),
                f"user {user!r}: expected x = strings of at most "
                f"{seq_len} characters and y = single characters",
            )
        pairs.append(next_char_example(x, y, seq_len, SHAKESPEARE_VOCAB))
    inputs, targets = zip(*pairs, strict=True)
    return torch.tensor(inputs, dtype=torch.long), torch.tensor(targets, dtype=torch.long)


def build_femnist(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(LeafParams, params, "task")
    train, test = load_clients(Path(p.path), p.max_clients, _femnist_user, p.lazy)
    return Task(
        name="femnist",
        train=train,
        model_fn=functools.partial(build_model, p.model, (1, 28, 28), 62),
        loss_fn=cross_entropy,
        test=test,
        metric_fns={"accuracy": accuracy},
        meta={"num_classes": 62, "source": str(p.path)},
    )


def build_shakespeare(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(LeafShakespeareParams, params, "task")
    vocab = SHAKESPEARE_VOCAB
    convert = functools.partial(_shakespeare_user, p.seq_len)
    train, test = load_clients(Path(p.path), p.max_clients, convert, p.lazy)
    return Task(
        name="shakespeare",
        train=train,
        model_fn=functools.partial(build_model, p.model, (p.seq_len,), vocab.size),
        loss_fn=sequence_cross_entropy(vocab.pad),
        test=test,
        metric_fns={"accuracy": sequence_accuracy(vocab.pad)},
        meta={"vocab": vocab, "source": str(p.path)},
    )
