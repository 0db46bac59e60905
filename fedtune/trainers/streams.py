"""NumPy's seeded PCG64 streams, many at once, bit-identical to ``np.random.default_rng(entropy)``.

The engine draws each client's mini-batches from its own stream, seeded by (stream tag, trial
seed, round, client) (:mod:`fedtune.trainers.sampling`). Building one ``default_rng`` costs about
40 µs, most of it NumPy's ``SeedSequence`` mixing four words in Python-level loops; a packed trial
of 64 configurations and 10 clients per round builds 640 of them per round. This module does the
same mixing for a whole cohort with NumPy array arithmetic, sets one reusable generator's state
to each result, and gives the same draws: the ``SeedSequence`` entropy pool and
``generate_state`` (O'Neill's seed_seq_fe, as NumPy implements it) and PCG64's seeding
(``pcg_setseq_128_srandom_r``: O'Neill 2014, "PCG: A Family of Simple Fast Space-Efficient
Statistically Good Algorithms for Random Number Generation") are reproduced word for word.
Entropy with a word outside ``[0, 2³²)`` (a seed of 2³² or more) is left to NumPy itself.
tests/unit/test_streams.py compares both paths on thousands of entropy tuples.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

__all__ = ["generators", "prepared"]

_MASK32 = np.uint64(0xFFFFFFFF)
_SHIFT = np.uint64(16)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = np.uint64(0xCA01F9DD), np.uint64(0x4973F715)
_POOL = 4
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_MASK128 = (1 << 128) - 1

_local = threading.local()


class _Hash:
    """SeedSequence's running hash constant and its ``hashmix`` over uint32 words (in uint64)."""

    def __init__(self, init: int, mult: int) -> None:
        self.const, self.mult = init, mult

    def __call__(self, value: np.ndarray) -> np.ndarray:
        value = (value ^ np.uint64(self.const)) & _MASK32
        self.const = (self.const * self.mult) & 0xFFFFFFFF
        value = (value * np.uint64(self.const)) & _MASK32
        return value ^ (value >> _SHIFT)


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = (_MIX_L * x - _MIX_R * y) & _MASK32
    return result ^ (result >> _SHIFT)


def _pcg_states(rows: Sequence[tuple[int, ...]]) -> list[tuple[int, int]]:
    """PCG64 (state, inc) of ``default_rng(row)`` for each row (words in ``[0, 2³²)``, ≤ 4)."""
    if not rows:
        return []
    words = np.asarray(rows, dtype=np.uint64)
    n, width = words.shape
    hashmix = _Hash(_INIT_A, _MULT_A)
    pool = [hashmix(words[:, i] if i < width else np.zeros(n, np.uint64)) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = _mix(pool[dst], hashmix(pool[src]))
    out_hash = _Hash(_INIT_B, _MULT_B)
    state = [out_hash(pool[i % _POOL]) for i in range(2 * _POOL)]  # generate_state(4, uint64)
    seeds = [(state[2 * j] | (state[2 * j + 1] << np.uint64(32))).tolist() for j in range(4)]
    out = []
    for hi, lo, inc_hi, inc_lo in zip(*seeds, strict=True):
        inc = ((((inc_hi << 64) | inc_lo) << 1) | 1) & _MASK128
        s = (inc + ((hi << 64) | lo)) & _MASK128  # state 0, one step, plus the seed
        out.append(((s * _PCG_MULT + inc) & _MASK128, inc))  # one more step
    return out


def _small(rows: list[tuple[int, ...]]) -> bool:
    """Whether every row has 1 to 4 words, each an integer in ``[0, 2³²)`` (the vectorised
    path)."""
    try:
        words = np.asarray(rows)
    except ValueError:  # rows of unequal length
        return False
    return (
        words.ndim == 2
        and 0 < words.shape[1] <= _POOL
        and words.dtype.kind in "iu"
        and int(words.min()) >= 0
        and int(words.max()) <= 0xFFFFFFFF
    )


@contextmanager
def prepared(rows: Sequence[Sequence[int]]) -> Iterator[None]:
    """Seed the streams of ``rows`` in one vectorised pass for the :func:`generators` calls
    inside the block (a packed trial's members × clients: one pass instead of one per member).

    Args:
        rows: Entropy tuples; rows the vectorised path cannot take are left to the calls.
    """
    rows = [tuple(row) for row in rows]
    ready = dict(zip(rows, _pcg_states(rows), strict=True)) if rows and _small(rows) else {}
    outer = _local.__dict__.get("prepared")
    _local.prepared = {**(outer or {}), **ready}
    try:
        yield
    finally:
        _local.prepared = outer


def _checkout() -> tuple[np.random.PCG64, np.random.Generator]:
    """A generator this thread's :func:`generators` call has to itself (kept for reuse)."""
    spare = _local.__dict__.setdefault("spare", [])
    if spare:
        return spare.pop()
    bits = np.random.PCG64(0)
    return bits, np.random.Generator(bits)


def generators(rows: Sequence[Sequence[int]]):
    """Yield ``np.random.default_rng(row)``'s generator for each entropy row, in order.

    Each yielded generator is valid until the next one is yielded (the call reseeds one
    generator in place): draw from it before advancing.

    Args:
        rows: Entropy tuples of equal length (at most 4 words), e.g. (tag, seed, round, client).

    Yields:
        A generator whose draws equal those of ``np.random.default_rng(row)``.
    """
    rows = [tuple(row) for row in rows]
    known = _local.__dict__.get("prepared") or {}
    missing = [row for row in rows if row not in known]
    if missing and not _small(missing):
        for row in rows:
            yield np.random.default_rng(list(row))
        return
    states = dict(zip(missing, _pcg_states(missing), strict=True))
    bits, gen = pair = _checkout()
    try:
        for row in rows:
            state, inc = known[row] if row in known else states[row]
            bits.state = {
                "bit_generator": "PCG64",
                "state": {"state": state, "inc": inc},
                "has_uint32": 0,
                "uinteger": 0,
            }
            yield gen
    finally:
        _local.spare.append(pair)
