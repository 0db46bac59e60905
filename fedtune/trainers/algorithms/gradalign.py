"""GradAlign and FedGA (Dandi et al. 2021 (arXiv:2106.13897) Algorithms 1–3,
docs/explanation/algorithms.md §4.3–4.4).

One round with K local steps, client lr α (``client_lr``), displacement β (``ga_beta``), over
the sampled clients with aggregation weights w_i::

    g_i ← ∇f_i(x);  ḡ ← Σ_i w_i g_i;  v_i ← ḡ − g_i          # extra communication round
    ga_form = "once"        (Alg. 2): y_0 = x − βv_i;  y_{k+1} = y_k − α ∇f_i(y_k; ζ_{i,k})
    ga_form = "every_step"  (Alg. 3): y_0 = x;         y_{k+1} = y_k − α ∇f_i(y_k − βv_i; ζ_{i,k})
    q ← Σ_i w_i Σ_k ∇f_i(·; ζ_{i,k})  (the gradients actually taken);   x ← ServerOpt(x, q, η)

The paper averages the client models (x ← Σ_i w_i y_K): that is ``server_opt: sgd`` with
η = α. In Alg. 2 the displacements −βv_i are not reverted; they cancel in the average because
Σ_i w_i v_i = 0 (ḡ uses the same weights), so the message carries only the gradients and is well
defined at α = 0. Alg. 2 and Alg. 3 visit the same points shifted by βv_i (the correct form of the
rewrite in App. A.5, docs/explanation/algorithms.md §9 item 13), hence give the same update.
GradAlign is FedGA with K = 1: x ← x − η Σ_i w_i ∇f_i(x − βv_i), which for quadratic f_i is exactly
gradient descent on f + βr (r of :mod:`.dissimilarity`).

``ga_full_batch`` (the paper's Algorithm writes the full local gradient;
docs/explanation/algorithms.md §9 item 13 notes it is unstated): g_i(x) from the client's full local
data (default) or from one extra mini-batch drawn with the round's batches (then K + 1 batches are
drawn, the last for g_i(x)).

Round diagnostics: ``alignment_r`` = r(x) = ½ Σ_i w_i ‖g_i − ḡ‖² and ``grad_dissimilarity`` =
Σ_i w_i ‖g_i − ḡ‖ over the cohort at the broadcast point; ``comm_rounds`` = 2 synchronisations
and ``comm_vectors`` = 4 model-sized vectors per client (x and ḡ down, g_i and the update up;
docs/explanation/algorithms.md §4.6). The same class with ``mode="correct"`` is the SCAFFOLD variant
of the paper (:mod:`.scaffold`): the drift correction v_i is added to every local gradient instead.

This module also holds the local routine shared by the drift-corrected methods
(:func:`local_sgd_fn`). The alignment part declares its hyperparameters in :data:`GA_HPARAMS`
(:mod:`fedtune.trainers.hparams`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch

from ..func_grad import grad
from ..part_hparams import GA_HPARAMS
from ..server_opt import ServerOpt, make_server_opt
from ..steps import where_step
from ..tasks.base import Task
from .base import Cohort, RoundContext, ServerState, tree_norm, weighted_mean
from .dissimilarity import (
    alignment_regulariser,
    cohort_gradients,
    deviations,
    gradient_dissimilarity,
)
from .recipe import Recipe

__all__ = ["GA_HPARAMS", "AlignedLocalUpdate", "local_sgd_fn"]

Params = dict[str, torch.Tensor]


def _pick(common: dict, own: dict, key: str) -> Params | None:
    a, b = common.get(key), own.get(key)
    if a is None or b is None:
        return a if b is None else b
    return {n: a[n] + b[n] for n in a}


def local_sgd_fn(loss_of: Callable[..., torch.Tensor], steps: int) -> Callable[..., dict]:
    """Pure ``fn(x, lr, common, xb, yb, own) -> {delta, gsum, graw, g0}`` for a runner.

    ``common`` (shared) and ``own`` (per client) are dicts with optional parameter-shaped entries
    ``start``, ``shift``, ``corr`` (summed when both give one)::

        y_0 = x + start;   g_k = ∇f(y_k + shift; batch k);   y_{k+1} = y_k − lr (g_k + corr)

    Returns delta = y_K − x, gsum = Σ_k (g_k + corr), graw = Σ_k g_k and g0 = g_0. An ``own``
    entry ``mask`` [steps] (heterogeneous local work, :mod:`fedtune.trainers.steps`) makes the
    steps where it is unset exact no-ops: y, gsum and graw keep their values bit for bit.
    """
    gradient = grad(loss_of)

    def fn(x: Params, lr, common: dict, xb, yb, own: dict) -> dict:
        start, shift, corr = (_pick(common, own, k) for k in ("start", "shift", "corr"))
        mask = own.get("mask")
        y = x if start is None else {n: x[n] + start[n] for n in x}
        gsum = graw = g0 = {n: torch.zeros_like(v) for n, v in x.items()}
        for k in range(steps):
            point = y if shift is None else {n: y[n] + shift[n] for n in y}
            g = gradient(point, xb[k], yb[k])
            if k == 0:
                g0 = g
            d = g if corr is None else {n: g[n] + corr[n] for n in g}
            new = (
                {n: graw[n] + g[n] for n in g},
                {n: gsum[n] + d[n] for n in d},
                {n: y[n] - lr * d[n] for n in y},
            )
            if mask is not None:
                new = tuple(
                    where_step(mask[k], a, b) for a, b in zip(new, (graw, gsum, y), strict=True)
                )
            graw, gsum, y = new
        return {"delta": {n: y[n] - x[n] for n in x}, "gsum": gsum, "graw": graw, "g0": g0}

    return fn


Mode = Literal["once", "every_step", "correct"]


class AlignedLocalUpdate:
    """FedGA (``once`` / ``every_step``) and SCAFFOLD-GA (``correct``); see module docstring."""

    def __init__(
        self,
        name: str,
        local_steps: int,
        server_opt: ServerOpt,
        mode: Mode,
        beta: float = 0.0,
        full_batch: bool = True,
    ) -> None:
        self.name = name
        self.local_steps = local_steps
        self.server_opt = server_opt
        self.mode = mode
        self.beta = beta
        self.full_batch = full_batch

    def num_batches(self) -> int:
        return self.local_steps + (0 if self.full_batch else 1)

    def init(self, params: Params) -> ServerState:
        return ServerState(params=params, opt_state=self.server_opt.init(params))

    def broadcast(self, state: ServerState) -> Params:
        return self.server_opt.broadcast(state.params, state.opt_state)

    def _own(self, dev: Params) -> dict:
        """Per-client inputs of the local routine from the deviations g_i − ḡ = −v_i."""
        if self.mode == "correct":  # ∇f_i(y) + ḡ − g_i
            return {"corr": {k: -v for k, v in dev.items()}}
        displaced = {k: self.beta * v for k, v in dev.items()}  # −β v_i
        return {"start" if self.mode == "once" else "shift": displaced}

    def apply(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        x = self.broadcast(state)
        K = cohort.k_max(self.local_steps)  # padded steps first, then the g_i(x) batch
        g = cohort_gradients(
            ctx.runner,
            ctx.loss_of,
            ctx.data,
            x,
            cohort,
            full_batch=self.full_batch,
            batch_index=K,
        )
        _, dev = deviations(g, cohort.weights)
        rows = cohort.batches[:, :K]
        lr = torch.tensor(ctx.client_lr, dtype=next(iter(x.values())).dtype)
        own = self._own(dev)
        if cohort.steps is not None:
            own["mask"] = cohort.mask()
        out = ctx.runner.map(
            local_sgd_fn(ctx.loss_of, K),
            (x, lr, {}),
            (ctx.data.inputs[rows], ctx.data.targets[rows], own),
        )
        q = weighted_mean(out["gsum"], cohort.weights)
        params, opt_state = self.server_opt.step(state.params, state.opt_state, q, ctx.server_lr)
        diag = {
            "update_norm": tree_norm(q),
            "alignment_r": alignment_regulariser(g, cohort.weights),
            "grad_dissimilarity": gradient_dissimilarity(g, cohort.weights),
            "comm_rounds": 2.0,
            "comm_vectors": 4.0,
        }
        return ServerState(params, opt_state, state.extra), diag


def build_fedga(recipe: Recipe, hp: Any, local_steps: int, task: Task) -> AlignedLocalUpdate:
    return AlignedLocalUpdate(
        recipe.name, local_steps, make_server_opt(hp), hp.ga_form, hp.ga_beta, hp.ga_full_batch
    )


def build_gradalign(recipe: Recipe, hp: Any, local_steps: int, task: Task) -> AlignedLocalUpdate:
    return AlignedLocalUpdate(
        recipe.name, 1, make_server_opt(hp), "every_step", hp.ga_beta, hp.ga_full_batch
    )
