"""Seeded client sampling and mini-batch index draws (explicit randomness, STYLE.md habit 4).

* The cohort of round t depends only on (data seed, t): M clients drawn uniformly *without*
  replacement within a round and independently across rounds (`001_2dc7ddae5cbdc81f.txt` §8), so
  every trial of a study sees the same clients whatever its hyperparameters.
* The mini-batches of client i in round t depend only on (trial seed, t, i): ``with_replacement``
  draws K·B example indices uniformly with replacement (the theory's assumption, ALGORITHMS.md
  §1.2); ``shuffle`` walks fresh permutations of the client's examples; ``full`` uses all of them
  at every step (exact gradient descent).

Generators are numpy ``SeedSequence``-based, hence bit-identical across processes and machines.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["batch_indices", "sample_clients"]

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
    rng = np.random.default_rng([_BATCH_STREAM, trial_seed, round_idx, client])
    need = steps * batch_size
    if mode == "with_replacement":
        local = rng.integers(0, count, size=need)
    else:  # shuffle: consecutive permutations
        reps = -(-need // count)
        local = np.concatenate([rng.permutation(count) for _ in range(reps)])[:need]
    return torch.from_numpy(local.reshape(steps, batch_size).astype(np.int64) + offset)
