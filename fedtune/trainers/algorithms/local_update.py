"""LocalUpdate (ALGORITHMS.md §1; `000_4bdc3753d62a87e2.txt` §2.1, `001_2dc7ddae5cbdc81f.txt` §2.1).

    ServerUpdate: for t = 0 … T−1
        I_t ← M clients (seeded, without replacement within the round)
        q_i ← ClientUpdate(i, broadcast(x_t), α, γ_t, Θ)          (see ``client.py``)
        q_t ← Σ_i w_i q_i      (w uniform, or ∝ client example counts)
        x_{t+1} ← ServerOpt.step(x_t, q_t, η_t)                  (see ``server_opt.py``)

Every registry entry of plain local-update methods (FedAvg, FedSGD, Reptile, FedProx,
Lookahead, FOMAML, MAML, FedAvgM, FedAdam, FedYogi, FedAdagrad, …) is this one class with a
different :class:`ClientRule` and server optimizer: composition, not copied loops.
"""

from __future__ import annotations

import torch

from ..client import ClientRule, make_client_fn
from ..server_opt import ServerOpt
from .base import Cohort, RoundContext, ServerState, tree_norm, weighted_mean

__all__ = ["LocalUpdate"]


class LocalUpdate:
    def __init__(self, name: str, rule: ClientRule, server_opt: ServerOpt) -> None:
        self.name = name
        self.rule = rule
        self.server_opt = server_opt
        self._client_fns: dict[int, object] = {}

    def num_batches(self) -> int:
        return self.rule.num_batches

    def init(self, params):
        return ServerState(params=params, opt_state=self.server_opt.init(params))

    def broadcast(self, state: ServerState):
        return self.server_opt.broadcast(state.params, state.opt_state)

    def client_fn(self, ctx: RoundContext):
        key = id(ctx.loss_of)
        if key not in self._client_fns:
            self._client_fns[key] = make_client_fn(ctx.loss_of, self.rule)
        return self._client_fns[key]

    def messages(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        """Stacked client messages [M, ...] computed at the broadcast point."""
        x = self.broadcast(state)
        xb = ctx.data.inputs[cohort.batches]
        yb = ctx.data.targets[cohort.batches]
        lr = torch.tensor(ctx.client_lr, dtype=next(iter(x.values())).dtype)
        return ctx.runner.map(self.client_fn(ctx), (x, lr), (xb, yb))

    def apply(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        q = weighted_mean(self.messages(state, cohort, ctx), cohort.weights)
        params, opt_state = self.server_opt.step(state.params, state.opt_state, q, ctx.server_lr)
        return ServerState(params, opt_state, state.extra), {"update_norm": tree_norm(q)}
