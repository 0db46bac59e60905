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

_SHIFT = np.uint32(16)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = np.uint32(0xCA01F9DD), np.uint32(0x4973F715)
_POOL = 4
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_MASK128 = (1 << 128) - 1

_local = threading.local()


def _hash_constants(init: int, mult: int, calls: int) -> tuple[list[int], list[int]]:
    """SeedSequence's ``hashmix`` constants of its first ``calls`` calls: call j XORs with
    init·multʲ and multiplies by init·multʲ⁺¹ (mod 2³²)."""
    consts = [init]
    for _ in range(calls):
        consts.append((consts[-1] * mult) & 0xFFFFFFFF)
    return consts[:-1], consts[1:]


def _column(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint32)[:, None]


# The entropy pool's hash: calls 0-3 fill the pool; then, for each source word s, calls
# 4 + 3s … 6 + 3s hash it for the other three words in order. Row d of a source's columns holds
# the call that mixes into word d (row s: the constants of call 0, a placeholder: that row's
# result is discarded).
_A_XOR, _A_MUL = _hash_constants(_INIT_A, _MULT_A, _POOL + _POOL * (_POOL - 1))
_FILL_XOR, _FILL_MUL = _column(_A_XOR[:_POOL]), _column(_A_MUL[:_POOL])
_MIX_CALLS = [
    [
        _POOL + src * (_POOL - 1) + (dst if dst < src else dst - 1) if dst != src else 0
        for dst in range(_POOL)
    ]
    for src in range(_POOL)
]
_MIX_XOR = [_column([_A_XOR[c] for c in calls]) for calls in _MIX_CALLS]
_MIX_MUL = [_column([_A_MUL[c] for c in calls]) for calls in _MIX_CALLS]
#: the output hash of ``generate_state(4, uint64)``: 8 calls, pool word i mod 4 each
_B_XOR, _B_MUL = _hash_constants(_INIT_B, _MULT_B, 2 * _POOL)
_OUT_XOR, _OUT_MUL = _column(_B_XOR), _column(_B_MUL)
_OUT_WORDS = [i % _POOL for i in range(2 * _POOL)]


def _hashmix(value: np.ndarray, xor: np.ndarray, mul: np.ndarray) -> np.ndarray:
    """``hashmix`` of several calls at once (uint32, wrapping as NumPy's C code does): row j
    of ``value`` with row j's constants."""
    value = (value ^ xor) * mul
    return value ^ (value >> _SHIFT)


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = _MIX_L * x - _MIX_R * y
    return result ^ (result >> _SHIFT)


def _pcg_states(rows: Sequence[tuple[int, ...]]) -> list[tuple[int, int]]:
    """PCG64 (state, inc) of ``default_rng(row)`` for each row (words in ``[0, 2³²)``, ≤ 4).

    SeedSequence's hash calls follow one another, but the three that hash the same source
    word (its mixing loop: for each source, every other word) read the same value, so they are
    one array operation over ``[4, rows]``: the seeding is a few dozen operations whatever the
    number of rows.
    """
    if not rows:
        return []
    words = np.asarray(rows, dtype=np.uint32)
    n, width = words.shape
    pool = np.zeros((_POOL, n), dtype=np.uint32)
    pool[:width] = words.T
    pool = _hashmix(pool, _FILL_XOR, _FILL_MUL)
    for src in range(_POOL):
        kept = pool[src].copy()
        pool = _mix(pool, _hashmix(kept, _MIX_XOR[src], _MIX_MUL[src]))
        pool[src] = kept
    state = _hashmix(pool[_OUT_WORDS], _OUT_XOR, _OUT_MUL).astype(np.uint64)
    seeds = (state[0::2] | (state[1::2] << np.uint64(32))).tolist()  # generate_state(4, uint64)
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
