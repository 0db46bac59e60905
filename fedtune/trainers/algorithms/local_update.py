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
from ..server_opt import ServerOpt
from ..steps import theta_rows
from .base import Cohort, Params, RoundContext, ServerState, tree_norm, weighted_mean

__all__ = ["Aggregator", "LocalUpdate", "mean_aggregator"]


class Aggregator(Protocol):
    """``(messages [M, ...], weights [M], steps τ [M], client_lr) -> (q, diagnostics)``."""

    def __call__(
        self, messages: Params, weights: torch.Tensor, steps: torch.Tensor, client_lr: float
    ) -> tuple[Params, dict[str, float]]: ...


def mean_aggregator(messages, weights, steps, client_lr):
    """q = Σ_i w_i q_i (the LocalUpdate average, docs/explanation/algorithms.md §1.3)."""
    return weighted_mean(messages, weights), {}


class LocalUpdate:
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
        self._client_fns: dict[tuple[int, bool], object] = {}

    def num_batches(self) -> int:
        return self.rule.num_batches

    def init(self, params):
        return ServerState(params=params, opt_state=self.server_opt.init(params))

    def broadcast(self, state: ServerState):
        return self.server_opt.broadcast(state.params, state.opt_state)

    def client_fn(self, ctx: RoundContext, masked: bool = False):
        key = (id(ctx.loss_of), masked)
        if key not in self._client_fns:
            make = make_masked_client_fn if masked else make_client_fn
            self._client_fns[key] = make(ctx.loss_of, self.rule)
        return self._client_fns[key]

    def messages(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        """Stacked client messages [M, ...] computed at the broadcast point."""
        x = self.broadcast(state)
        xb = ctx.data.inputs[cohort.batches]
        yb = ctx.data.targets[cohort.batches]
        dtype = next(iter(x.values())).dtype
        lr = torch.tensor(ctx.client_lr, dtype=dtype)
        if cohort.steps is None:
            return ctx.runner.map(self.client_fn(ctx), (x, lr), (xb, yb))
        k_max = cohort.k_max(0)
        theta = theta_rows(self.rule.preset, cohort.steps, k_max, dtype)
        return ctx.runner.map(
            self.client_fn(ctx, masked=True), (x, lr), (xb, yb, theta, cohort.mask())
        )

    def apply(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        steps = cohort.step_counts(int(self.rule.theta.shape[0]))
        q, diag = self.aggregator(
            self.messages(state, cohort, ctx), cohort.weights, steps, ctx.client_lr
        )
        params, opt_state = self.server_opt.step(state.params, state.opt_state, q, ctx.server_lr)
        return ServerState(params, opt_state, state.extra), {"update_norm": tree_norm(q), **diag}
