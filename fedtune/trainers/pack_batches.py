"""The batch rows of a group of pack members for one round.

Each member of a :class:`~fedtune.trainers.packed.PackedTrainer` draws its clients' batches from
its own trial seed, exactly as its unpacked :class:`~fedtune.trainers.engine.Trainer` would:
with fixed local steps K_p in one vectorised draw for every member
(:func:`~fedtune.trainers.sampling.trials_batch_indices`), with local epochs (τ_i =
⌈E_p·n_i/B⌉) or full batches from the engine's per-client streams
(:func:`~fedtune.trainers.engine.cohort_rows`). The members' rows are padded to the group's
K_max by repeating each client's last drawn batch (real rows, masked out by the step mask), with
the Θ rows of the client rule (zero past a client's own steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .algorithms import Cohort
from .engine import cohort_rows
from .pack_state import Member
from .sampling import batch_streams, trials_batch_indices
from .steps import theta_rows
from .streams import prepared

__all__ = ["group_batches"]


def group_batches(
    members: Sequence[Member],
    t: int,
    clients: torch.Tensor,
    data: Any,
    weights: torch.Tensor,
    client_sizes: torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[Cohort]]:
    """Every member's batch rows for round ``t``, padded to the group's K_max.

    Args:
        members: The group's members (one round index, one cohort).
        t: The round (0-based).
        clients: The cohort's client ids ``[M]``.
        data: The cohort's view of the training data.
        weights: The cohort's aggregation weights ``[M]``.
        client_sizes: Every client's number of examples (the whole split).
        dtype: The pack's floating-point type (of the Θ rows).
        device: Where the pack computes.

    Returns:
        Rows ``[G, M, K_max, B]``, steps ``[G, M]``, Θ rows ``[G, M, K_max]`` and each
        member's :class:`~fedtune.trainers.algorithms.Cohort` (for its record).
    """
    train = members[0].config.train  # batch_size and batch_sampling are the pack's
    if train.batch_sampling != "full" and all(m.config.train.local_epochs is None for m in members):
        drawn = [
            (None, rows)
            for rows in trials_batch_indices(
                [m.config.seed for m in members],
                t,
                clients,
                data.offsets[clients],
                data.counts[clients],
                [m.algorithm.num_batches() for m in members],
                train.batch_size,
                train.batch_sampling,
            )
        ]
    else:
        drawn = []
        cohort = clients.tolist()
        streams = [row for m in members for row in batch_streams(m.config.seed, t, cohort)]
        with prepared(streams):  # every member's client streams seeded in one pass
            for m in members:
                nb = m.algorithm.num_batches()
                steps, rows = cohort_rows(
                    m.config, nb, m.local_steps, t, clients, data, client_sizes
                )
                drawn.append((steps, rows))
    k_max = max(rows.shape[1] for _, rows in drawn)
    all_rows, all_steps, all_thetas, cohorts = [], [], [], []
    size = len(clients)
    for m, (steps, rows) in zip(members, drawn, strict=True):
        cohorts.append(Cohort(clients, rows, weights, steps))
        nb = rows.shape[1]
        if nb < k_max:  # the padding repeats the last drawn batch (real rows, masked)
            rows = torch.cat([rows, rows[:, -1:].expand(size, k_max - nb, -1)], 1)
        if steps is None:
            theta = torch.zeros(k_max, dtype=dtype)
            theta[:nb] = m.algorithm.rule.theta.to(dtype)
            theta = theta.expand(size, k_max)
            steps = torch.full((size,), nb, dtype=torch.long)
        else:
            theta = theta_rows(m.algorithm.rule.preset, steps, k_max, dtype)
        all_rows.append(rows)
        all_steps.append(steps)
        all_thetas.append(theta)
    return (
        torch.stack(all_rows).to(device),
        torch.stack(all_steps).to(device),
        torch.stack(all_thetas).to(device),
        cohorts,
    )
