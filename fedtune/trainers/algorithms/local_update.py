"""LocalUpdate (docs/explanation/algorithms.md §1; Charles & Konečný 2021 (arXiv:2103.05032) §2.1,
Charles & Konečný 2020 (arXiv:2007.00878) §2.1).

    ServerUpdate: for t = 0 … T−1
        I_t ← M clients (seeded, without replacement within the round)
        q_i ← ClientUpdate(i, broadcast(x_t), α, γ_t, Θ)          (see ``client.py``)
        q_t ← Aggregator(q_i, w_i, τ_i)   default Σ_i w_i q_i (w uniform, or ∝ example counts)
        x_{t+1} ← ServerOpt.step(x_t, q_t, η_t)                  (see ``server_opt.py``)

Every registry entry of plain local-update methods (FedAvg, FedSGD, Reptile, FedProx,
Lookahead, FOMAML, MAML, FedAvgM, FedAdam, FedYogi, FedAdagrad, …) is this one class with a
different :class:`ClientRule` and server optimizer: composition, not copied loops. The
aggregator is a part too: FedNova (:mod:`.fednova`) is this class with normalized averaging.
With heterogeneous steps (``cohort.steps``, ``train.local_epochs``) the clients run the masked
client function over the padded batches and the aggregator receives every τ_i.
"""

from __future__ import annotations

from typing import Protocol

import torch

from ..client import ClientRule, make_client_fn, make_masked_client_fn
from ..first_step import (
    client_data,
    client_means,
    make_measuring_client_fn,
    measures_in_first_step,
)
from ..server_opt import ServerOpt
from ..steps import theta_rows
from .base import Cohort, Params, RoundContext, ServerState, tree_norm, weighted_mean

__all__ = ["Aggregator", "LocalUpdate", "PackedAggregator", "mean_aggregator"]


class Aggregator(Protocol):
    """The aggregation part of a local-update method: the clients' messages to one update q."""

    def __call__(
        self, messages: Params, weights: torch.Tensor, steps: torch.Tensor, client_lr: float
    ) -> tuple[Params, dict[str, float]]:
        """Aggregate one round's messages.

        Args:
            messages: The clients' messages q_i, stacked ``[M, ...]``.
            weights: Their aggregation weights w_i ``[M]``.
            steps: Their local steps τ_i ``[M]``.
            client_lr: The client learning rate γ_t in force.

        Returns:
            The update q and diagnostics to log.
        """
        ...


class PackedAggregator(Protocol):
    """An :class:`Aggregator` over the P members of a pack at once (``fedtune.trainers.packed``).

    Member p's update must equal the unpacked aggregator's on its own messages: packs are exact.
    """

    def __call__(
        self, messages: Params, weights: torch.Tensor, steps: torch.Tensor, client_lr: torch.Tensor
    ) -> tuple[Params, dict[str, torch.Tensor]]:
        """Aggregate one round's messages of every member.

        Args:
            messages: The members' clients' messages, stacked ``[P, M, ...]``.
            weights: The cohort's aggregation weights w_i ``[M]`` (one cohort for the pack).
            steps: Each member's clients' local steps τ_i ``[P, M]``.
            client_lr: Each member's client learning rate γ_t ``[P]``.

        Returns:
            The updates ``[P, ...]`` and diagnostics to log, each ``[P]``.
        """
        ...


def mean_aggregator(messages, weights, steps, client_lr):
    """Aggregate by the weighted mean q = Σ_i w_i q_i, the default :class:`Aggregator`.

    Args:
        messages: The clients' messages q_i, stacked ``[M, ...]``.
        weights: Their weights w_i ``[M]``.
        steps: Their local steps (unused).
        client_lr: The client learning rate (unused).

    Returns:
        q and no diagnostics.
    """
    return weighted_mean(messages, weights), {}


class LocalUpdate:
    """A local-update method: client rule, aggregator and server optimizer.

    Each round, q_i ← ClientUpdate(i, x_t, γ_t, Θ), q_t ← Aggregator(q_i, w_i, τ_i) and
    x_{t+1} ← ServerOpt.step(x_t, q_t, η_t) (Charles & Konečný 2021 (arXiv:2103.05032) §2.1).

    Args:
        name: The algorithm's name.
        rule: The client rule (local steps, rates, message).
        server_opt: The server optimizer.
        aggregator: The aggregation part (default: the weighted mean).
    """

    def __init__(
        self,
        name: str,
        rule: ClientRule,
        server_opt: ServerOpt,
        aggregator: Aggregator = mean_aggregator,
    ) -> None:
        self.name = name
        self.rule = rule
        self.server_opt = server_opt
        self.aggregator = aggregator
        self._client_fns: dict[tuple[int, bool, bool], object] = {}

    def num_batches(self) -> int:
        """Batches each client draws per round (the client rule's K)."""
        return self.rule.num_batches

    def init(self, params):
        """Make the initial server state: ``params`` and the server optimizer's state."""
        return ServerState(params=params, opt_state=self.server_opt.init(params))

    def broadcast(self, state: ServerState):
        """Give the model the clients receive (the server optimizer's broadcast point)."""
        return self.server_opt.broadcast(state.params, state.opt_state)

    def client_fn(self, ctx: RoundContext, masked: bool = False, measuring: bool = False):
        """Give the pure client function for the round's loss (built once, then cached).

        Args:
            ctx: The round's context.
            masked: The function for heterogeneous steps (padded batches and a step mask).
            measuring: The function that also gives ℓ_i from its first step
                (:func:`~fedtune.trainers.first_step.make_measuring_client_fn`).

        Returns:
            The client function the runner maps over the cohort.
        """
        key = (id(ctx.loss_of), masked, measuring)
        if key not in self._client_fns:
            if measuring:
                fn = make_measuring_client_fn(ctx.loss_of, self.rule, masked)
            else:
                fn = (make_masked_client_fn if masked else make_client_fn)(ctx.loss_of, self.rule)
            self._client_fns[key] = fn
        return self._client_fns[key]

    def measures_client_losses(self, cohort: Cohort, ctx: RoundContext) -> bool:
        """Whether this round's clients can give their loss ℓ_i at the broadcast model from
        their first local step (:func:`~fedtune.trainers.first_step.measures_in_first_step`:
        a first-order rule, whose first step is at the broadcast model, and clients no larger
        than the batch).

        Args:
            cohort: The round's clients and batches.
            ctx: The round's context.

        Returns:
            True when :meth:`apply_measuring` may run the round.
        """
        counts = ctx.data.counts[cohort.clients.cpu()]
        return measures_in_first_step(self.rule, ctx.loss_of, counts, cohort.batches.shape[2])

    def messages(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        """Run the clients' local steps from the broadcast point.

        Args:
            state: The server state.
            cohort: The round's clients and batches.
            ctx: The round's context.

        Returns:
            The clients' messages q_i, stacked ``[M, ...]``.
        """
        return self._run_clients(state, cohort, ctx, measuring=False)

    def _run_clients(self, state: ServerState, cohort: Cohort, ctx: RoundContext, measuring: bool):
        """The clients' messages (and, ``measuring``, their losses ℓ_i: steps 2… read
        ``cohort.batches[:, 1:]``, step 1 the clients' examples)."""
        x = self.broadcast(state)
        rows = cohort.batches[:, 1:] if measuring else cohort.batches
        xb, yb = ctx.data.inputs[rows], ctx.data.targets[rows]
        dtype = next(iter(x.values())).dtype
        lr = torch.tensor(ctx.client_lr, dtype=dtype)
        own = client_data(ctx.data, cohort.clients, cohort.batches, dtype) if measuring else None
        per_client = () if own is None else own.per_client()
        masked = cohort.steps is not None
        if masked:
            theta = theta_rows(self.rule.preset, cohort.steps, cohort.k_max(0), dtype)
            per_client = (theta, cohort.mask(), *per_client)
        out = ctx.runner.map(self.client_fn(ctx, masked, measuring), (x, lr), (xb, yb, *per_client))
        if own is None:
            return out
        messages, losses = out
        return messages, client_means(losses, own.counts)

    def apply(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        """Run one round: messages, aggregation, server step.

        Args:
            state: The server state.
            cohort: The round's clients, batches and weights.
            ctx: The round's context.

        Returns:
            The new state and diagnostics: ``update_norm`` (of q_t) and the aggregator's.
        """
        return self._server_step(state, cohort, ctx, self.messages(state, cohort, ctx))

    def apply_measuring(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        """Run one round as :meth:`apply` does, the clients giving ℓ_i from their first step
        (only where :meth:`measures_client_losses` says so).

        Args:
            state: The server state.
            cohort: The round's clients, batches and weights.
            ctx: The round's context.

        Returns:
            The new state, the diagnostics and the clients' losses ℓ_i at the broadcast
            model ``[M]``.
        """
        messages, losses = self._run_clients(state, cohort, ctx, measuring=True)
        return (*self._server_step(state, cohort, ctx, messages), losses)

    def _server_step(self, state: ServerState, cohort: Cohort, ctx: RoundContext, messages):
        steps = cohort.step_counts(int(self.rule.theta.shape[0]))
        q, diag = self.aggregator(messages, cohort.weights, steps, ctx.client_lr)
        params, opt_state = self.server_opt.step(state.params, state.opt_state, q, ctx.server_lr)
        return ServerState(params, opt_state, state.extra), {"update_norm": tree_norm(q), **diag}
