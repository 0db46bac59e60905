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
"""

from __future__ import annotations

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
    rngs = generators([row for s in trial_seeds for row in batch_streams(s, round_idx, cohort)])
    out = []
    for k in steps:
        need = k * batch_size
        local = np.empty((len(cohort), need), dtype=np.int64)
        for i, n in enumerate(sizes):
            local[i] = _draws(next(rngs), n, need, mode)
        local += base
        out.append(torch.from_numpy(local).view(len(cohort), k, batch_size))
    rngs.close()
    return out
