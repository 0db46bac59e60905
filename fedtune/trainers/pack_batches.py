"""The batch rows of a group of pack members for one round, drawn a round ahead where that is
free time.

Each member of a :class:`~fedtune.trainers.packed.PackedTrainer` draws its clients' batches from
its own trial seed, exactly as its unpacked :class:`~fedtune.trainers.engine.Trainer` would:
with fixed local steps K_p in one vectorised draw for every member
(:func:`~fedtune.trainers.sampling.trials_batch_indices`), with local epochs (τ_i =
⌈E_p·n_i/B⌉) or full batches from the engine's per-client streams
(:func:`~fedtune.trainers.engine.cohort_rows`). The members' rows are padded to the group's
K_max by repeating each client's last drawn batch (real rows, masked out by the step mask), with
the Θ rows of the client rule (zero past a client's own steps).

A member's rows are a function of what :func:`draw_key` names (its trial seed, the round, its
local work) and of the round's cohort, which depends on the data seed and the round alone. So
:class:`BatchRows` can draw round t+1's rows while round t's local steps run on a GPU (queued
there, the host is free until it reads their results) and hand them out when round t+1 opens:
the same rows, off the round's critical path (docs/explanation/packing.md, "CUDA graphs").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from .algorithms import Cohort
from .engine import cohort_rows
from .pack_state import Member
from .sampling import batch_streams, sample_clients, trials_batch_indices
from .steps import theta_rows
from .streams import prepared
from .tasks import InMemoryData

__all__ = ["BatchRows", "draw_key", "draw_rows", "round_clients"]

#: one member's draw: its clients' local steps τ_i ``[M]`` (None: every client runs its K) and
#: rows ``[M, nb, B]``
Drawn = tuple[torch.Tensor | None, torch.Tensor]


def round_clients(members: Sequence[Member], t: int, num_clients: int) -> torch.Tensor:
    """The cohort of round ``t`` (from the data seed and t alone: the same for every member).

    Args:
        members: The group's members (their task and ``clients_per_round`` are the pack's).
        t: The round (0-based).
        num_clients: The population's size.

    Returns:
        The cohort's client ids ``[M]``.
    """
    config = members[0].config
    ids = sample_clients(config.task.seed, t, num_clients, config.train.clients_per_round)
    return torch.from_numpy(ids)


def draw_key(member: Member, t: int) -> tuple:
    """What a member's draw of round ``t`` reads of it: equal keys, equal rows."""
    train = member.config.train
    return (
        t,
        member.config.seed,
        member.algorithm.num_batches(),
        member.local_steps,
        train.local_epochs,
        train.batch_size,
        train.batch_sampling,
    )


def draw_rows(
    members: Sequence[Member],
    t: int,
    clients: torch.Tensor,
    data: Any,
    client_sizes: torch.Tensor,
) -> list[Drawn]:
    """Every member's own draw of round ``t`` (not yet padded).

    Args:
        members: The members (one round index, one cohort).
        t: The round (0-based).
        clients: The cohort's client ids ``[M]``.
        data: The cohort's view of the training data.
        client_sizes: Every client's number of examples (the whole split).

    Returns:
        One :data:`Drawn` per member, in order.
    """
    train = members[0].config.train  # batch_size and batch_sampling are the pack's
    if train.batch_sampling != "full" and all(m.config.train.local_epochs is None for m in members):
        return [
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
    drawn = []
    cohort = clients.tolist()
    streams = [row for m in members for row in batch_streams(m.config.seed, t, cohort)]
    with prepared(streams):  # every member's client streams seeded in one pass
        for m in members:
            nb = m.algorithm.num_batches()
            drawn.append(cohort_rows(m.config, nb, m.local_steps, t, clients, data, client_sizes))
    return drawn


class BatchRows:
    """Every group's batch rows: each member's from an earlier draw when there is one.

    Args:
        data: The pack's training data.
        ahead: Draw rows ahead (:meth:`ahead`) when the data is in memory; a file-backed
            store's cohort would have to be loaded first, so its rows wait for their round.
        dtype: The pack's floating-point type (of the Θ rows).
        device: Where the pack computes.
    """

    def __init__(self, data: Any, ahead: bool, dtype: torch.dtype, device: torch.device) -> None:
        self.client_sizes, self.dtype, self.device = data.client_sizes, dtype, device
        #: the data rows are drawn ahead from (None: none are)
        self.data = data if ahead and isinstance(data, InMemoryData) else None
        self._ahead: dict[tuple, Drawn] = {}
        #: members' rows handed out, and how many of them had been drawn ahead
        self.taken = self.reused = 0

    def ahead(self, rounds: Iterable[tuple[int, Sequence[Member]]]) -> None:
        """Draw each listed round's rows of its members, forgetting every earlier draw.

        Args:
            rounds: (round, the members that will run it) per group; no-op without ``data``.
        """
        self._ahead = {}
        if self.data is None:
            return
        for t, members in rounds:
            if not members:
                continue
            clients = round_clients(members, t, self.data.num_clients)
            try:
                drawn = draw_rows(members, t, clients, self.data, self.client_sizes)
            except Exception:  # its own round raises it again, after this round's records
                continue
            self._ahead.update(zip([draw_key(m, t) for m in members], drawn, strict=True))

    def group(
        self,
        members: Sequence[Member],
        t: int,
        clients: torch.Tensor,
        data: Any,
        weights: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[Cohort]]:
        """Every member's batch rows for round ``t``, padded to the group's K_max.

        Args:
            members: The group's members (one round index, one cohort).
            t: The round (0-based).
            clients: The cohort's client ids ``[M]``.
            data: The cohort's view of the training data.
            weights: The cohort's aggregation weights ``[M]``.

        Returns:
            Rows ``[G, M, K_max, B]``, steps ``[G, M]``, Θ rows ``[G, M, K_max]`` and each
            member's :class:`~fedtune.trainers.algorithms.Cohort` (for its record).
        """
        keys = [draw_key(m, t) for m in members]
        missing = [(m, k) for m, k in zip(members, keys, strict=True) if k not in self._ahead]
        if missing:
            fresh = draw_rows([m for m, _ in missing], t, clients, data, self.client_sizes)
            self._ahead.update(zip([k for _, k in missing], fresh, strict=True))
        self.taken += len(members)
        self.reused += len(members) - len(missing)
        drawn = [self._ahead[k] for k in keys]
        return _padded(members, drawn, clients, weights, self.dtype, self.device)


def _padded(
    members: Sequence[Member],
    drawn: Sequence[Drawn],
    clients: torch.Tensor,
    weights: torch.Tensor,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[Cohort]]:
    """The members' draws padded to the group's K_max, with their Θ rows, on ``device``.

    Args:
        members: The group's members.
        drawn: Their draws, in order.
        clients: The cohort's client ids ``[M]``.
        weights: The cohort's aggregation weights ``[M]``.
        dtype: The pack's floating-point type (of the Θ rows).
        device: Where the pack computes.

    Returns:
        Rows ``[G, M, K_max, B]``, steps ``[G, M]``, Θ rows ``[G, M, K_max]`` and each
        member's :class:`~fedtune.trainers.algorithms.Cohort`.
    """
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
