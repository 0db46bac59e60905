"""The local steps of a pack's (member, client) pairs, and their weighted mean.

A :class:`~fedtune.trainers.packed.PackedTrainer` round runs the K local steps of every pair of
(member, client) as one batch: :class:`PackedClients` flattens the G members' M clients to G·M
pairs for :func:`~fedtune.trainers.client.make_packed_client_fn`, with γ_t and α per pair, and
averages each member's messages with its cohort's weights while they are in cache,

    q_p = Σ_i w_i q_{p,i}   (the :func:`~fedtune.trainers.algorithms.base.weighted_mean` of the
                             unpacked round),

unless the recipe aggregates the messages itself (``packed_aggregator``: the messages
``[G, M, …]`` are then returned as they are). On a CPU it runs at most a chunk of members per
call, so that one client state ``[chunk, M, parameters]`` stays within
:data:`CPU_CHUNK_BYTES`; the numbers do not change with the chunk. Given a
:data:`~fedtune.trainers.pack_graph.Capture` (a CUDA graph on a GPU), the steps of a chunk
are recorded once per shape and replayed (:class:`~fedtune.trainers.pack_graph.ReplayedCalls`),
every pair computing every step, a step mask applied with ``torch.where`` (members of
different K, clients of different τ_i); the numbers do not change either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .client import make_packed_client_fn
from .module_loss import ModuleLoss
from .pack_graph import Capture, ReplayedCalls
from .steps import step_mask

__all__ = ["CPU_CHUNK_BYTES", "PackedClients", "member_sums"]

Params = dict[str, torch.Tensor]

#: on a CPU, the members per vmapped client call are chosen so that one client state
#: ``[members, M, parameters]`` takes at most this many bytes
CPU_CHUNK_BYTES = 16 * 2**20


def member_sums(v: torch.Tensor, g: int, m: int) -> torch.Tensor:
    """Each member's sum over its clients of ``v [G·M, …]``: ``[G, …]``, in ``v``'s memory order.

    The sum of ``v.unflatten(0, (g, m)).sum(1)``; but a reduction writes a contiguous result,
    so a ``v`` laid out otherwise (a batched weight's gradient comes transposed) would be read
    across its rows. Its trailing dimensions are permuted into memory order for the sum and
    back after it; the order of the additions, which a reduction chooses by layout, may differ
    (docs/explanation/packing.md, "A CPU pack and its arithmetic ceiling").

    Args:
        v: The pairs' tensors, the pairs (member-major) first.
        g: Members.
        m: Clients per member.

    Returns:
        The sums, laid out as ``v``'s trailing dimensions.
    """
    order = sorted(range(1, v.dim()), key=lambda d: -v.stride(d))
    back = [0] + [order.index(d) + 1 for d in range(1, v.dim())]
    return v.permute(0, *order).unflatten(0, (g, m)).sum(1).permute(*back)


class PackedClients:
    """Runs the local steps of G members' clients and aggregates each member's messages.

    Args:
        loss_of: The task's loss of a model's parameters.
        units: The client rule's units (:attr:`~fedtune.trainers.algorithms.LocalUpdate.rule`).
        averaged: Whether to take each member's weighted mean (False: the recipe's
            ``packed_aggregator`` takes the messages).
        device: Where the pack computes.
        dtype: Its floating-point type.
        chunk: Members per call (None: all at once on a GPU; on a CPU as many as
            :data:`CPU_CHUNK_BYTES` allows).
        capture: Record each call once per shape and replay it (None: every call runs as it
            is).
    """

    def __init__(
        self,
        loss_of: ModuleLoss,
        units: Any,
        averaged: bool,
        device: torch.device,
        dtype: torch.dtype,
        chunk: int | None = None,
        capture: Capture | None = None,
    ) -> None:
        self._client_fn: Callable[..., Params] = make_packed_client_fn(loss_of, units)
        self.averaged, self.device, self.dtype, self.chunk = averaged, device, dtype, chunk
        #: the recorded calls (None: no capture)
        self.replayed = (
            None
            if capture is None
            else ReplayedCalls(lambda *args: self._steps(*args, dense=True), capture)
        )

    def __call__(
        self,
        client_lr: Sequence[float],
        alphas: Sequence[float],
        x: Params,
        rows: torch.Tensor,
        steps: torch.Tensor,
        thetas: torch.Tensor,
        weights: torch.Tensor,
        data: Any,
    ) -> Params:
        """The aggregated client messages ``q [G, …]`` (or the messages ``[G, M, …]``).

        Args:
            client_lr: Each member's client rate γ_t.
            alphas: Each member's proximal weight α.
            x: The members' broadcast models ``[G, …]``.
            rows: Their clients' batch rows ``[G, M, K_max, B]``.
            steps: Their clients' local steps ``[G, M]``.
            thetas: Their clients' Θ rows ``[G, M, K_max]``.
            weights: Their cohorts' weights ``[G, M]``.
            data: The cohort's view of the data.

        Returns:
            Each member's update, at most a chunk of members per call, written into one output.
        """
        k_max = rows.shape[2]
        masked = bool(steps.min() < k_max)
        mask = step_mask(steps.reshape(-1), k_max).reshape((*steps.shape, k_max))
        lr = torch.tensor(list(client_lr), dtype=self.dtype, device=self.device)
        alpha = (
            torch.tensor(list(alphas), dtype=self.dtype, device=self.device)
            if any(alphas)
            else None
        )
        members = len(client_lr)
        chunk = self.chunk or self._auto_chunk(members, rows.shape[1], x)
        q: Params = {}
        for a in range(0, members, chunk):
            part = slice(a, a + chunk)
            done = self._clients(
                {k: v[part] for k, v in x.items()},
                lr[part],
                None if alpha is None else alpha[part],
                rows[part],
                thetas[part],
                mask[part] if masked else None,
                weights[part],
                data,
            )
            if a == 0 and chunk >= members:
                return done
            for k, v in done.items():
                if k not in q:
                    q[k] = v.new_empty((members, *v.shape[1:]))
                q[k][part] = v
        return q

    def _clients(self, x, lr, alpha, rows, thetas, mask, weights, data) -> Params:
        """One chunk of G members, replayed where there is a capture."""
        copied = (x, lr, alpha, rows, thetas, weights, mask)
        if self.replayed is not None:
            return self.replayed(copied, (data.inputs, data.targets))
        return self._steps(*copied, data.inputs, data.targets)

    def _steps(
        self, x, lr, alpha, rows, thetas, weights, mask, inputs, targets, dense=False
    ) -> Params:
        """One chunk of G members: the pairs flattened to G·M (batches gathered from the
        cohort's ``inputs`` and ``targets`` one step at a time, ``[G·M, B, …]``), then averaged
        per member. ``dense``: every pair computes every step (see
        :func:`~fedtune.trainers.client.make_packed_client_fn`)."""
        g, m = rows.shape[:2]

        def pairs(v: torch.Tensor | None) -> torch.Tensor | None:  # [G, M, …] -> [G·M, …]
            return None if v is None else v.reshape(g * m, *v.shape[2:])

        def per_pair(v: torch.Tensor | None) -> torch.Tensor | None:  # [G, …] -> [G·M, …]
            return None if v is None else pairs(v.unsqueeze(1).expand(g, m, *v.shape[1:]))

        out = self._client_fn(
            {k: per_pair(v) for k, v in x.items()},
            per_pair(lr),
            per_pair(alpha),
            pairs(rows),
            inputs,
            targets,
            pairs(thetas),
            pairs(mask),
            dense,
        )
        if not self.averaged:  # the recipe's aggregator takes every message
            return {k: v.unflatten(0, (g, m)) for k, v in out.items()}
        w = weights.reshape(g * m)
        return {
            k: member_sums(v.mul_(w.view(-1, *([1] * (v.dim() - 1)))), g, m) for k, v in out.items()
        }

    def _auto_chunk(self, members: int, clients: int, x: Params) -> int:
        if self.device.type != "cpu":
            return members
        size = torch.finfo(self.dtype).bits // 8
        state = clients * sum(v[0].numel() for v in x.values()) * size
        return max(1, min(members, CPU_CHUNK_BYTES // max(state, 1)))
