"""Seeded client sampling and mini-batch index draws (explicit randomness, docs/development/style.md
habit 4).

* The cohort of round t depends only on (data seed, t): M clients drawn uniformly *without*
  replacement within a round and independently across rounds
  (Charles & Konečný 2020 (arXiv:2007.00878) §8), so every trial of a study sees the same clients
  whatever its hyperparameters.
* The mini-batches of client i in round t depend only on (trial seed, t, i): ``with_replacement``
  draws K·B example indices uniformly with replacement (the theory's assumption,
  docs/explanation/algorithms.md §1.2); ``shuffle`` walks fresh permutations of the client's
  examples; ``full`` uses all of them at every step (exact gradient descent).

Generators are numpy ``SeedSequence``-based, hence bit-identical across processes and machines.
Several trials' ``with_replacement`` draws are taken in one pass over their streams' raw words
(:func:`trials_batch_indices`), bit-identical to each stream's ``Generator.integers``.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from .streams import generators

__all__ = [
    "batch_indices",
    "batch_streams",
    "cohort_batch_indices",
    "sample_clients",
    "trials_batch_indices",
]

_COHORT_STREAM = 0xC0
_BATCH_STREAM = 0xBA


def sample_clients(data_seed: int, round_idx: int, num_clients: int, m: int) -> np.ndarray:
    """Indices of the M clients of round ``round_idx`` (sorted, without replacement)."""
    rng = np.random.default_rng([_COHORT_STREAM, data_seed, round_idx])
    m = min(m, num_clients)
    return np.sort(rng.choice(num_clients, size=m, replace=False))


def batch_indices(
    trial_seed: int,
    round_idx: int,
    client: int,
    offset: int,
    count: int,
    steps: int,
    batch_size: int,
    mode: str,
) -> torch.Tensor:
    """Global row indices [steps, B] (B = count for ``full``) of a client's local batches."""
    if mode == "full":
        rows = torch.arange(count, dtype=torch.long) + offset
        return rows.unsqueeze(0).expand(steps, count).clone()
    local = _local_draws(trial_seed, round_idx, client, count, steps * batch_size, mode)
    return torch.from_numpy(local.reshape(steps, batch_size).astype(np.int64) + offset)


def _local_draws(
    trial_seed: int, round_idx: int, client: int, count: int, need: int, mode: str
) -> np.ndarray:
    """``need`` positions in ``[0, count)`` from the stream of (trial seed, round, client)."""
    rng = np.random.default_rng([_BATCH_STREAM, trial_seed, round_idx, client])
    return _draws(rng, count, need, mode)


def batch_streams(trial_seed: int, round_idx: int, clients: list[int]) -> list[tuple[int, ...]]:
    """The entropy of each client's batch stream in round ``round_idx`` (for
    :func:`fedtune.trainers.streams.prepared`: a packed trial seeds its members' streams at once).

    Args:
        trial_seed: The trial's seed.
        round_idx: The round's index.
        clients: Global client indices.

    Returns:
        One entropy tuple per client, as its ``default_rng`` takes it.
    """
    return [(_BATCH_STREAM, trial_seed, round_idx, c) for c in clients]


def _draws(rng: np.random.Generator, count: int, need: int, mode: str) -> np.ndarray:
    if mode == "with_replacement":
        return rng.integers(0, count, size=need)
    reps = -(-need // count)  # shuffle: consecutive permutations
    return np.concatenate([rng.permutation(count) for _ in range(reps)])[:need]


#: the largest count whose uniform draws :func:`_bounded_rows` reproduces (NumPy's 32-bit path);
#: on a big-endian machine the 32-bit halves are in the other order, and NumPy draws them itself
_BOUNDED_MAX = 2**32 if sys.byteorder == "little" else 0


def _bounded_rows(words: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``Generator.integers(0, n_i, size=need)`` of each row's stream, from its 32-bit outputs.

    NumPy draws an integer below n ≤ 2³² with Lemire's method on the generator's 32-bit outputs
    (``buffered_bounded_lemire_uint32``; PCG64 gives the low, then the high half of each 64-bit
    output): m = u·n is accepted when its low 32 bits are at least (2³² − n) mod n, and the
    value is m >> 32 (Lemire 2019, "Fast Random Integer Generation in an Interval",
    arXiv:1805.10941). Here all rows' candidates are scaled at once; a row with a rejection
    among them (probability at most need·n/2³²) is left to NumPy.

    Args:
        words: Each stream's first ``need`` 32-bit outputs ``[R, need]`` (its ``random_raw``
            words viewed as uint32, on a little-endian machine).
        counts: Each row's n ``[R]`` (1 ≤ n ≤ 2³²).

    Returns:
        The values ``[R, need]`` and which rows had a rejection (their values are not valid).
    """
    n = counts.astype(np.uint64)[:, None]
    scaled = words.astype(np.uint64)
    scaled *= n
    rejected = (scaled.astype(np.uint32) < (np.uint64(2**32) - n) % n).any(1)
    scaled >>= np.uint64(32)
    return scaled.view(np.int64), rejected  # every value is below 2³²: the same bits


def cohort_batch_indices(
    trial_seed: int,
    round_idx: int,
    clients: torch.Tensor,
    offsets: torch.Tensor,
    counts: torch.Tensor,
    steps: int,
    batch_size: int,
    mode: str,
) -> torch.Tensor:
    """Rows [M, steps, B] of a cohort (``offsets``/``counts`` aligned with ``clients``): row i
    is ``batch_indices(trial_seed, round_idx, clients[i], offsets[i], counts[i], …)``.

    Each client keeps its own generator (its rows do not depend on the rest of the cohort);
    what is done once for the cohort is the rest: the generators' seeding
    (:func:`~fedtune.trainers.streams.generators`, bit-identical to ``default_rng``), one numpy
    array of draws, the offsets added in one operation, one tensor (``full``: one broadcast)."""
    m = int(clients.shape[0])
    if mode == "full":
        count = int(counts[0])  # equal sizes (checked by the caller)
        rows = torch.arange(count, dtype=torch.long).expand(m, steps, count)
        return rows + offsets.to(torch.long).view(m, 1, 1)
    return trials_batch_indices(
        [trial_seed], round_idx, clients, offsets, counts, [steps], batch_size, mode
    )[0]


def trials_batch_indices(
    trial_seeds: list[int],
    round_idx: int,
    clients: torch.Tensor,
    offsets: torch.Tensor,
    counts: torch.Tensor,
    steps: list[int],
    batch_size: int,
    mode: str,
) -> list[torch.Tensor]:
    """The rows of one cohort for several trials: entry j is ``cohort_batch_indices(
    trial_seeds[j], round_idx, clients, offsets, counts, steps[j], batch_size, mode)``.

    A packed trial's members share the cohort; their (trial, client) streams are seeded in one
    vectorised pass and drawn in one loop, with the cohort's sizes and offsets read once.

    Args:
        trial_seeds: Each trial's seed.
        round_idx: The round's index.
        clients: The cohort's global client indices ``[M]``.
        offsets: Each client's first global row ``[M]``.
        counts: Each client's number of examples ``[M]``.
        steps: Each trial's number of batches per client.
        batch_size: B.
        mode: ``with_replacement`` or ``shuffle`` (``full``: one trial at a time).

    Returns:
        One int64 tensor ``[M, steps[j], B]`` per trial.
    """
    if mode == "full":
        return [
            cohort_batch_indices(s, round_idx, clients, offsets, counts, k, batch_size, mode)
            for s, k in zip(trial_seeds, steps, strict=True)
        ]
    cohort, sizes = clients.tolist(), counts.tolist()
    base = offsets.numpy().astype(np.int64)[:, None]
    streams = [row for s in trial_seeds for row in batch_streams(s, round_idx, cohort)]
    rngs = generators(streams)
    needs = [k * batch_size for k in steps]
    m = len(cohort)
    if mode == "with_replacement" and min(sizes) >= 1 and max(sizes) <= _BOUNDED_MAX:
        drawn = _bounded_cohorts(rngs, streams, needs, sizes)
    else:
        drawn = []
        for need in needs:
            local = np.empty((m, need), dtype=np.int64)
            for i, n in enumerate(sizes):
                local[i] = _draws(next(rngs), n, need, mode)
            drawn.append(local)
    rngs.close()
    out = []
    for local, k in zip(drawn, steps, strict=True):
        local += base
        out.append(torch.from_numpy(local).view(m, k, batch_size))
    return out


def _bounded_cohorts(rngs, streams: list, needs: list[int], sizes: list[int]) -> list[np.ndarray]:
    """Each trial's ``with_replacement`` draws ``[M, need]``: every stream's raw words in stream
    order, written straight into one array per distinct ``need``, then one :func:`_bounded_rows`
    pass per array; a row with a rejection is drawn by NumPy itself from its stream's start."""
    m = len(sizes)
    groups = {need: [j for j, n in enumerate(needs) if n == need] for need in dict.fromkeys(needs)}
    raw = {need: np.empty((len(js) * m, (need + 1) // 2), np.uint64) for need, js in groups.items()}
    block = {j: pos * m for js in groups.values() for pos, j in enumerate(js)}
    for j, need in enumerate(needs):  # stream order; each trial's rows in its need's array
        words = raw[need]
        for i in range(m):
            words[block[j] + i] = next(rngs).bit_generator.random_raw(words.shape[1])
    out: list[np.ndarray] = [np.empty(0)] * len(needs)
    counts = np.asarray(sizes, dtype=np.int64)
    for need, trials in groups.items():
        values, rejected = _bounded_rows(
            raw[need].view(np.uint32)[:, :need], np.tile(counts, len(trials))
        )
        for row in np.flatnonzero(rejected):
            j, i = trials[row // m], row % m
            rng = np.random.default_rng(list(streams[j * m + i]))
            values[row] = _draws(rng, sizes[i], need, "with_replacement")
        for pos, j in enumerate(trials):
            out[j] = values[pos * m : (pos + 1) * m]
    return out
