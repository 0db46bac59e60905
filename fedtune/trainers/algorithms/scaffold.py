"""SCAFFOLD: the variant analysed in Dandi et al. 2021 (arXiv:2106.13897) and the original stateful
algorithm.

``scaffold_ga`` — Dandi et al. 2021 Algorithm 4 / App. A.6 (docs/explanation/algorithms.md §4.5):
fresh controls each round from an extra communication round, over the sampled clients::

    g_i ← ∇f_i(x);  ḡ ← Σ_i w_i g_i
    y_0 = x;  y_{k+1} = y_k − α (∇f_i(y_k; ζ_{i,k}) + ḡ − g_i)
    q ← Σ_i w_i Σ_k (∇f_i(y_k; ζ_{i,k}) + ḡ − g_i);   x ← ServerOpt(x, q, η)   (paper: sgd, η = α)

It is :class:`~.gradalign.AlignedLocalUpdate` with ``mode="correct"`` (same diagnostics:
``alignment_r``, ``grad_dissimilarity``, 2 communication rounds, 4 vectors per client).
``ga_full_batch`` picks full-data or mini-batch g_i(x) as for FedGA.

``scaffold`` — the original stateful algorithm (Karimireddy et al. 2020, cited by
Dandi et al. 2021 and Augenstein et al. 2022 (arXiv:2205.13655);
docs/explanation/algorithms.md §9 item 14). The server keeps a global control c and one control c_i
per client ever sampled (c_i = 0 before)::

    y_0 = x;  y_{k+1} = y_k − α (∇f_i(y_k; ζ_{i,k}) − c_i + c)
    option 2: c_i⁺ = c_i − c + (x − y_K)/(Kα) = (1/K) Σ_k ∇f_i(y_k; ζ_{i,k})   (K → τ_i with
              train.local_epochs: each client's own step count)
    option 1: c_i⁺ = ∇f_i(x)   (full local data; one extra gradient per client)
    q ← Σ_i w_i Σ_k (∇f_i(y_k) − c_i + c);  x ← ServerOpt(x, q, η)
    c ← c + (1/N) Σ_{i∈S} (c_i⁺ − c_i)           (N clients in the federation: c = mean of all c_i)

The original global step x ← x + η_g mean_i(y_K − x) is ``server_opt: sgd`` with η = η_g·α.
Option 2 is computed from the gradient sum, so it is defined at α = 0. One communication round,
4 vectors per client (x, c down; update and Δc_i up).

State (``ServerState.extra``, tensors only, so checkpoints restore exactly): ``scaffold_c`` (c)
and ``scaffold_controls`` — a client table ``{"ids": int64 [n], "rows": {name: [n, ...]}}``
holding c_i of the n distinct clients seen so far, sorted by client index: memory grows as
n·|x| (at most the federation size N), never with the number of rounds.
"""

from __future__ import annotations

from typing import Any

import torch

from ..part_hparams import SCAFFOLD_HPARAMS
from ..server_opt import ServerOpt, make_server_opt
from ..tasks.base import Task
from .base import Cohort, RoundContext, ServerState, tree_norm, weighted_mean
from .dissimilarity import cohort_gradients
from .gradalign import AlignedLocalUpdate, local_sgd_fn
from .recipe import Recipe

__all__ = [
    "SCAFFOLD_HPARAMS",
    "Scaffold",
    "table_gather",
    "table_init",
    "table_scatter",
]

Params = dict[str, torch.Tensor]
Table = dict  # {"ids": LongTensor [n] (sorted), "rows": {name: Tensor [n, ...]}}


def table_init(like: Params) -> Table:
    """An empty per-client table whose rows have the shapes of ``like``."""
    ref = next(iter(like.values()))
    return {
        "ids": torch.zeros(0, dtype=torch.long, device=ref.device),
        "rows": {k: v.new_zeros((0, *v.shape)) for k, v in like.items()},
    }


def table_gather(table: Table, ids: torch.Tensor, fill: Params) -> Params:
    """Rows [M, ...] of clients ``ids``; a client not in the table gets ``fill`` (unstacked)."""
    known = table["ids"].to(ids.device)
    pos = torch.searchsorted(known, ids).clamp(max=max(known.numel() - 1, 0))
    found = (known[pos] == ids) if known.numel() else torch.zeros_like(ids, dtype=torch.bool)
    out = {}
    for k, rows in table["rows"].items():
        base = fill[k].unsqueeze(0).expand(ids.shape[0], *fill[k].shape)
        picked = rows[pos] if known.numel() else base
        mask = found.reshape(-1, *([1] * fill[k].dim()))
        out[k] = torch.where(mask, picked, base)
    return out


def table_scatter(table: Table, ids: torch.Tensor, rows: Params) -> Table:
    """A new table with the rows of clients ``ids`` set (inserted if new), ids kept sorted."""
    old = table["ids"].to(ids.device)
    union = torch.unique(torch.cat([old, ids]))  # sorted
    at_old, at_new = torch.searchsorted(union, old), torch.searchsorted(union, ids)
    new_rows = {}
    for k, v in rows.items():
        merged = v.new_zeros((union.numel(), *v.shape[1:]))
        merged[at_old] = table["rows"][k].to(v.device)
        merged[at_new] = v
        new_rows[k] = merged
    return {"ids": union, "rows": new_rows}


class Scaffold:
    """The original stateful SCAFFOLD (see module docstring)."""

    def __init__(self, name: str, local_steps: int, server_opt: ServerOpt, option: int = 2) -> None:
        self.name = name
        self.local_steps = local_steps
        self.server_opt = server_opt
        self.option = option

    def num_batches(self) -> int:
        return self.local_steps

    def init(self, params: Params) -> ServerState:
        zeros = {k: torch.zeros_like(v) for k, v in params.items()}
        extra = {"scaffold_c": zeros, "scaffold_controls": table_init(params)}
        return ServerState(params=params, opt_state=self.server_opt.init(params), extra=extra)

    def broadcast(self, state: ServerState) -> Params:
        return self.server_opt.broadcast(state.params, state.opt_state)

    def apply(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        x = self.broadcast(state)
        c = state.extra["scaffold_c"]
        zeros = {k: torch.zeros_like(v) for k, v in c.items()}
        c_i = table_gather(state.extra["scaffold_controls"], cohort.clients, zeros)
        own = {"corr": {k: c[k].unsqueeze(0) - c_i[k] for k in c}}
        if cohort.steps is not None:
            own["mask"] = cohort.mask()
        rows = cohort.batches
        lr = torch.tensor(ctx.client_lr, dtype=next(iter(x.values())).dtype)
        out = ctx.runner.map(
            local_sgd_fn(ctx.loss_of, cohort.k_max(self.local_steps)),
            (x, lr, {}),
            (ctx.data.inputs[rows], ctx.data.targets[rows], own),
        )
        if self.option == 1:
            new_ci = cohort_gradients(ctx.runner, ctx.loss_of, ctx.data, x, cohort, full_batch=True)
        else:
            new_ci = _mean_over_steps(out["graw"], cohort, self.local_steps)
        q = weighted_mean(out["gsum"], cohort.weights)
        params, opt_state = self.server_opt.step(state.params, state.opt_state, q, ctx.server_lr)
        n = ctx.data.num_clients
        new_c = {k: c[k] + (new_ci[k] - c_i[k]).sum(0) / n for k in c}
        table = table_scatter(state.extra["scaffold_controls"], cohort.clients, new_ci)
        extra = {**state.extra, "scaffold_c": new_c, "scaffold_controls": table}
        diag = {
            "update_norm": tree_norm(q),
            "control_norm": tree_norm(new_c),
            "control_clients": float(table["ids"].numel()),
            "comm_rounds": 1.0,
            "comm_vectors": 4.0,
        }
        return ServerState(params, opt_state, extra), diag


def _mean_over_steps(graw: Params, cohort: Cohort, fixed: int) -> Params:
    """c_i⁺ = (1/τ_i) Σ_k ∇f_i(y_k) (option 2; τ_i = K unless the steps are heterogeneous)."""
    if cohort.steps is None:
        return {k: v / fixed for k, v in graw.items()}
    return {
        k: v / cohort.steps.to(v.dtype).reshape(-1, *([1] * (v.dim() - 1))) for k, v in graw.items()
    }


def build_scaffold_ga(recipe: Recipe, hp: Any, local_steps: int, task: Task):
    return AlignedLocalUpdate(
        recipe.name, local_steps, make_server_opt(hp), "correct", full_batch=hp.ga_full_batch
    )


def build_scaffold(recipe: Recipe, hp: Any, local_steps: int, task: Task):
    return Scaffold(recipe.name, local_steps, make_server_opt(hp), hp.scaffold_option)
