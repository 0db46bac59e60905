"""Vocabularies, encoders and per-example losses shared by the text tasks.

Id layout (the TFF baselines of Reddi et al., used by Charles & Konečný 2021 (arXiv:2103.05032) and
Charles & Konečný 2020 (arXiv:2007.00878)): ``pad = 0``, the n in-vocabulary tokens ``1..n``, then
``oov = n+1``, ``bos = n+2``, ``eos = n+3`` — n + 4 symbols in all. Shakespeare uses the 86
characters of :data:`SHAKESPEARE_CHARS` (90 symbols, docs/explanation/algorithms.md §7.2); Stack
Overflow the most frequent 10,000 words (10,004 symbols).

Sequence losses average over the positions whose target is not ``pad``:
ℓ(x, y) = (1/|{t: y_t ≠ pad}|) Σ_{t: y_t ≠ pad} −log softmax(o_t)[y_t].
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

__all__ = [
    "SHAKESPEARE_CHARS",
    "SHAKESPEARE_VOCAB",
    "Vocab",
    "bag_of_words",
    "char_windows",
    "count_tokens",
    "most_frequent",
    "multi_hot",
    "multilabel_bce",
    "next_char_example",
    "precision_at_k",
    "sequence_accuracy",
    "sequence_cross_entropy",
    "word_sequence",
]

#: the 86 characters of the TFF/LEAF Shakespeare vocabulary (TFF text-generation tutorial order)
SHAKESPEARE_CHARS = (
    "dhlptx@DHLPTX $(,048cgkoswCGKOSW[_#'/37;?bfjnrvzBFJNRVZ\"&*.26:\naeimquyAEIMQUY]!%)-159\r"
)


@dataclass(frozen=True)
class Vocab:
    """Token ↔ id map: pad 0, ``tokens`` at 1..n, oov n+1, bos n+2, eos n+3."""

    tokens: tuple[str, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    pad: ClassVar[int] = 0

    def __post_init__(self) -> None:
        if len(set(self.tokens)) != len(self.tokens):
            raise ValueError("vocabulary tokens must be distinct")
        object.__setattr__(self, "_index", {t: i + 1 for i, t in enumerate(self.tokens)})

    @property
    def oov(self) -> int:
        return len(self.tokens) + 1

    @property
    def bos(self) -> int:
        return len(self.tokens) + 2

    @property
    def eos(self) -> int:
        return len(self.tokens) + 3

    @property
    def size(self) -> int:
        return len(self.tokens) + 4

    def encode(self, tokens: Iterable[str]) -> list[int]:
        oov = self.oov
        return [self._index.get(t, oov) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        special = {self.pad: "<pad>", self.oov: "<oov>", self.bos: "<bos>", self.eos: "<eos>"}
        return [special.get(int(i)) or self.tokens[int(i) - 1] for i in ids]


SHAKESPEARE_VOCAB = Vocab(tuple(SHAKESPEARE_CHARS))


def count_tokens(texts: Iterable[str], sep: str | None = None) -> Counter[str]:
    """Token counts over ``texts`` split on ``sep`` (whitespace when ``None``); empty tokens dropped."""
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(t for t in text.split(sep) if t)
    return counts


def most_frequent(counts: Counter[str], k: int) -> tuple[str, ...]:
    """The ``k`` most frequent tokens; ties broken alphabetically so the result is deterministic."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return tuple(t for t, _ in ranked[:k])


def _pad(ids: list[int], length: int, pad: int) -> list[int]:
    return ids + [pad] * (length - len(ids))


def char_windows(text: str, seq_len: int, vocab: Vocab) -> tuple[np.ndarray, np.ndarray]:
    """TFF Shakespeare: ``[bos] + chars + [eos]`` padded to a multiple of ``seq_len + 1`` and cut
    into windows; input = window[:-1], target = window[1:] (both ``int64 [n, seq_len]``)."""
    ids = [vocab.bos, *vocab.encode(text), vocab.eos]
    n = -(-len(ids) // (seq_len + 1))
    windows = np.array(_pad(ids, n * (seq_len + 1), vocab.pad), dtype=np.int64)
    windows = windows.reshape(n, seq_len + 1)
    return windows[:, :-1], windows[:, 1:]


def next_char_example(x: str, y: str, seq_len: int, vocab: Vocab) -> tuple[list[int], list[int]]:
    """LEAF Shakespeare: input ``x`` (≤ ``seq_len`` chars), target ``x[1:] + y`` — the input
    shifted by one followed by the next character — both right-padded to ``seq_len``."""
    if len(x) > seq_len:
        raise ValueError(f"input has {len(x)} characters, more than seq_len={seq_len}")
    return _pad(vocab.encode(x), seq_len, vocab.pad), _pad(
        vocab.encode(x[1:] + y), seq_len, vocab.pad
    )


def word_sequence(words: Sequence[str], seq_len: int, vocab: Vocab) -> tuple[list[int], list[int]]:
    """Stack Overflow next-word prediction (Charles & Konečný 2020 App. C): ``[bos] + first
    seq_len words + [eos]``, cut to ``seq_len + 1`` symbols and padded; input = [:-1], target = [1:]."""
    ids = [vocab.bos, *vocab.encode(words[:seq_len]), vocab.eos][: seq_len + 1]
    ids = _pad(ids, seq_len + 1, vocab.pad)
    return ids[:-1], ids[1:]


def bag_of_words(docs: Sequence[Sequence[str]], index: dict[str, int], dim: int) -> np.ndarray:
    """Row i counts the in-vocabulary words of ``docs[i]`` (column ``index[word]``), normalised to
    sum 1 (Charles & Konečný 2020 App. C); a document without known words is all zeros."""
    out = np.zeros((len(docs), dim), dtype=np.float32)
    for i, doc in enumerate(docs):
        cols = [index[w] for w in doc if w in index]
        if cols:
            np.add.at(out[i], cols, 1.0)
            out[i] /= len(cols)
    return out


def multi_hot(labels: Sequence[Sequence[str]], index: dict[str, int], dim: int) -> np.ndarray:
    """Row i has 1 at ``index[l]`` for every known label ``l`` of example i (float32)."""
    out = np.zeros((len(labels), dim), dtype=np.float32)
    for i, ls in enumerate(labels):
        out[i, [index[label] for label in ls if label in index]] = 1.0
    return out


def sequence_cross_entropy(pad: int = 0):
    """Per-example loss for logits ``[B, T, V]`` and targets ``[B, T]``: mean token
    cross-entropy over non-pad target positions (0 for an all-pad example)."""

    def loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        targets = targets.long()
        logp = torch.log_softmax(outputs, dim=-1)
        nll = -logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        mask = (targets != pad).to(nll.dtype)
        return (nll * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)

    return loss


def sequence_accuracy(pad: int = 0, ignore: Sequence[int] = ()):
    """Per-example fraction of the scored positions whose arg-max prediction equals the target;
    positions whose target is ``pad`` or in ``ignore`` are not scored (TFF's Stack Overflow
    accuracy also ignores oov/bos/eos)."""
    skipped = (pad, *ignore)

    def metric(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        targets = targets.long()
        mask = torch.ones_like(targets, dtype=outputs.dtype)
        for token in skipped:
            mask = mask * (targets != token).to(outputs.dtype)
        hit = (outputs.argmax(-1) == targets).to(outputs.dtype)
        return (hit * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)

    return metric


def multilabel_bce(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """One-vs-rest logistic loss, averaged over the tags: mean_j BCE(σ(o_j), y_j) per example."""
    return torch.nn.functional.binary_cross_entropy_with_logits(
        outputs, targets.to(outputs.dtype), reduction="none"
    ).mean(-1)


def precision_at_k(k: int = 5):
    """Per-example precision@k: the fraction of the k highest-scored tags that are true tags."""

    def metric(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        kk = min(k, outputs.shape[-1])
        top = outputs.topk(kk, dim=-1).indices
        return targets.to(outputs.dtype).gather(-1, top).sum(-1) / kk

    return metric
