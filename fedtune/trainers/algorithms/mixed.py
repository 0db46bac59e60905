"""Mixed federated learning (Augenstein et al. 2022 (arXiv:2205.13655) Algorithms 1–2,
docs/explanation/algorithms.md §5).

Objective f = f_f + f_c with the weights folded into the losses: f_f = w_f·(mean client loss),
w_f = ``task.meta["federated_weight"]`` (default 1), and f_c = w_c·(mean central loss on
``task.central``), w_c = ``task.central.weight``. Learning rates: η = ``client_lr``,
η_s = ``server_lr`` (model-delta units, paper default 1), η_c = ``central_lr`` (default η·η_s),
η_m = ``merge_lr`` (default 1); K = local steps, K_c = ``central_steps`` (default K),
|𝓑_c| = ``central_batch_size`` (default S·B for PT and 2-w GT, K·S·B for 1-w GT, the
equal-variance choice of §5.8; 0 = the whole central dataset). Client routine (Alg. 1)::

    y_0 = x;  y_{k+1} = y_k − η (g_i(y_k; 𝓑_i^k) + g̃_c);   Δ_i = y_K − x
    Δ̄ = Σ_i w_i Δ_i;   x_f = ServerOpt(x, −Δ̄, η_s);   Δ_f = x_f − x

* ``pt`` Parallel Training: g̃_c = 0; central branch x_c ← x_c − η_c ∇f_c(x_c; 𝓑_c^k) for
  k < K_c, Δ_c = x_c − x;  x ← x + η_m (Δ_c + Δ_f).
* ``gt1`` 1-way Gradient Transfer (Alg. 2): g̃_c = ∇f_c(x; 𝓑_c) from one central batch at the
  broadcast point; x ← x_f (no central steps, no merge).
* ``gt2`` 2-way Gradient Transfer: PT whose central steps use ∇f_c(x_c) + g̃_f and whose clients
  use g̃_c, both one round stale, then
  g̃_c ← (1/K_c) Σ_k ∇f_c(x_c^k; 𝓑_c^k) (= −Δ_c/(η_c K_c) − g̃_f),
  g̃_f ← Σ_i w_i (1/K) Σ_k g_i(y_k) (= −Σ_i Δ_i/(η Σ_i K_i) − g̃_c, App. A.2 with equal K_i).
  Initial values (unspecified in the paper): ``mixed_gt2_init: zero`` or ``fresh`` (gradients
  at x⁰ from the first cohort's first batches and one central batch).

Errata applied (docs/explanation/algorithms.md §9 item 15): Δ_c uses the last (K_c-th) central
iterate and g̃_c divides by η_c·K_c (the paper writes x_c^(t,J) and η·J); the augmenting gradients
are computed as gradient means directly, which equals the paper's delta formula for SGD and stays
defined at η = 0; the merge *sums* the two deltas with an explicit η_m. With η_m = 1 and η_c = η·η_s
the 2-w GT step is ≈ −2ηK∇f, twice PT's (§5.5 caveat): use η_m = ½ to match PT. PT ≡ 1-w GT
exactly at K = 1 (η_m = 1, η_c = η·η_s, same central batch).

Round diagnostics: ``mixed_G2`` = G̃_t², ``mixed_B2`` = B̃_t² (eq. 7, from the first client and
central gradients at the broadcast point, :mod:`.dissimilarity`), ``comm_vectors`` (2 for PT,
3 for GT: the model plus g̃_c down, the delta up) and ``central_batch`` = |𝓑_c|. Central batches
are drawn with replacement from a generator seeded by the trial seed when the round context
carries one (``ctx.seed``), otherwise by the round and the cohort's drawn batch rows (which
depend on the trial seed), so runs are reproducible.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torch.func import functional_call

from fedtune.errors import ConfigError

from ..func_grad import grad
from ..part_hparams import MIXED_HPARAMS
from ..server_opt import ServerOpt, make_server_opt
from ..tasks.base import Task
from .base import Cohort, RoundContext, ServerState, tree_norm, weighted_mean
from .dissimilarity import cohort_gradients, mixed_dissimilarity
from .gradalign import local_sgd_fn
from .recipe import Recipe

__all__ = ["MIXED_HPARAMS", "MixedFL", "movie_cost_model"]

Params = dict[str, torch.Tensor]
Variant = Literal["pt", "gt1", "gt2"]
_STREAM = 0xCE


class _Central:
    """f_c = w_c·(mean central loss) on ``task.central``, cast to the model's dtype/device."""

    def __init__(self, task: Task, like: torch.Tensor) -> None:
        central = task.central
        self.inputs, self.targets = (
            _cast(t, like) for t in (central.data.inputs, central.data.targets)
        )
        self.size = int(self.inputs.shape[0])
        w_c, loss_fn = float(central.weight), central.loss_fn
        if loss_fn is None:
            self.base = None
        else:  # a separate central loss needs the model's forward pass
            model = task.model_fn(torch.Generator().manual_seed(0)).to(like.device, like.dtype)
            self.base = lambda p, x, y: loss_fn(functional_call(model, p, (x,)), y).mean()
        self.weight = w_c

    def gradient_fn(self, ctx: RoundContext):
        base = self.base or ctx.loss_of
        return grad(base if self.weight == 1.0 else (lambda p, x, y: self.weight * base(p, x, y)))

    def rows(self, ctx: RoundContext, cohort: Cohort, size: int, steps: int, stream: int = 0):
        """[steps, size] row indices drawn with replacement (all rows when size is 0)."""
        if size == 0:
            return torch.arange(self.size).unsqueeze(0).expand(steps, self.size)
        seed = getattr(ctx, "seed", None)
        material = [_STREAM, stream, ctx.round]
        if seed is not None:
            material.append(int(seed))
        else:
            order = torch.argsort(cohort.clients)  # independent of the cohort's order
            material += cohort.clients[order].tolist() + cohort.batches[order].flatten().tolist()
        rng = np.random.default_rng(np.random.SeedSequence(material))
        return torch.from_numpy(rng.integers(0, self.size, size=(steps, size)))


def _cast(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.to(like.device, like.dtype) if t.is_floating_point() else t.to(like.device)


def _mean(trees: list[Params]) -> Params:
    return {k: sum(t[k] for t in trees) / len(trees) for k in trees[0]}


class MixedFL:
    """Parallel Training, 1-way and 2-way Gradient Transfer (see module docstring)."""

    def __init__(
        self,
        name: str,
        variant: Variant,
        local_steps: int,
        server_opt: ServerOpt,
        params: Any,
    ) -> None:
        self.name, self.variant, self.local_steps = name, variant, local_steps
        self.server_opt, self.p = server_opt, params
        self._central: dict = {}

    def num_batches(self) -> int:
        return self.local_steps

    def init(self, params: Params) -> ServerState:
        extra = {}
        if self.variant == "gt2":
            zeros = {k: torch.zeros_like(v) for k, v in params.items()}
            extra = {
                "gt_central": zeros,
                "gt_federated": dict(zeros),
                "gt_ready": self.p.mixed_gt2_init == "zero",
            }
        return ServerState(params=params, opt_state=self.server_opt.init(params), extra=extra)

    def broadcast(self, state: ServerState) -> Params:
        return self.server_opt.broadcast(state.params, state.opt_state)

    def _central_for(self, ctx: RoundContext, like: torch.Tensor) -> _Central:
        key = (like.dtype, like.device)
        if key not in self._central:
            self._central[key] = _Central(ctx.task, like)
        return self._central[key]

    def _central_steps(self, x, central, ctx, cohort, size, aug):
        """K_c central SGD steps (+ g̃_f): (Δ_c, first gradient, mean gradient)."""
        steps = self.p.central_steps or self.local_steps
        lr_c = self.p.central_lr if self.p.central_lr is not None else ctx.client_lr * ctx.server_lr
        rows = central.rows(ctx, cohort, size, steps).to(central.inputs.device)
        gradient, xc, grads = central.gradient_fn(ctx), x, []
        for k in range(steps):
            grads.append(gradient(xc, central.inputs[rows[k]], central.targets[rows[k]]))
            d = grads[-1] if aug is None else {n: grads[-1][n] + aug[n] for n in x}
            xc = {n: xc[n] - lr_c * d[n] for n in x}
        return {n: xc[n] - x[n] for n in x}, grads[0], _mean(grads)

    def apply(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        x = self.broadcast(state)
        like = next(iter(x.values()))
        central, fed_loss, extra = self._central_for(ctx, like), _fed_loss(ctx), dict(state.extra)
        if self.variant == "gt2" and not extra["gt_ready"]:
            extra = self._fresh_gradients(extra, x, cohort, ctx, central)
        K, M, B = self.local_steps, cohort.size, int(cohort.batches.shape[2])
        size = self.p.central_batch_size
        size = (K * M * B if self.variant == "gt1" else M * B) if size is None else size
        delta_c = None
        if self.variant == "gt1":
            rows = central.rows(ctx, cohort, size, 1)[0].to(like.device)
            gc0 = central.gradient_fn(ctx)(x, central.inputs[rows], central.targets[rows])
            common = {"corr": gc0}
        else:
            aug = extra["gt_federated"] if self.variant == "gt2" else None
            delta_c, gc0, gc_mean = self._central_steps(x, central, ctx, cohort, size, aug)
            common = {"corr": extra["gt_central"]} if self.variant == "gt2" else {}
        lr = torch.tensor(ctx.client_lr, dtype=like.dtype)
        data = (ctx.data.inputs[cohort.batches], ctx.data.targets[cohort.batches], {})
        out = ctx.runner.map(local_sgd_fn(fed_loss, K), (x, lr, common), data)
        q = {k: -v for k, v in weighted_mean(out["delta"], cohort.weights).items()}  # −Δ̄
        x_f, opt_state = self.server_opt.step(state.params, state.opt_state, q, ctx.server_lr)
        new = (
            x_f
            if delta_c is None
            else {k: x[k] + self.p.merge_lr * (delta_c[k] + x_f[k] - x[k]) for k in x}
        )
        if self.variant == "gt2":
            g_f = weighted_mean(out["graw"], cohort.weights)
            extra.update(gt_central=gc_mean, gt_federated={k: v / K for k, v in g_f.items()})
        g2, b2 = mixed_dissimilarity(
            weighted_mean(out["g0"], cohort.weights), gc0, _weight_f(ctx), central.weight
        )
        diag = {
            "update_norm": tree_norm({k: new[k] - x[k] for k in x}),
            "mixed_G2": g2,
            "mixed_B2": b2,
            "comm_vectors": 2.0 if self.variant == "pt" else 3.0,
            "central_batch": float(size or central.size),
        }
        return ServerState(new, opt_state, extra), diag

    def _fresh_gradients(self, extra, x, cohort, ctx, central) -> dict:
        size = self.p.central_batch_size
        size = cohort.size * int(cohort.batches.shape[2]) if size is None else size
        rows = central.rows(ctx, cohort, size, 1, stream=1)[0].to(central.inputs.device)
        g_f = cohort_gradients(ctx.runner, _fed_loss(ctx), ctx.data, x, cohort, full_batch=False)
        g_c = central.gradient_fn(ctx)(x, central.inputs[rows], central.targets[rows])
        return {
            **extra,
            "gt_central": g_c,
            "gt_federated": weighted_mean(g_f, cohort.weights),
            "gt_ready": True,
        }


def _weight_f(ctx: RoundContext) -> float:
    return float(ctx.task.meta.get("federated_weight", 1.0))


def _fed_loss(ctx: RoundContext):
    w_f = _weight_f(ctx)
    return ctx.loss_of if w_f == 1.0 else (lambda p, x, y: w_f * ctx.loss_of(p, x, y))


def movie_cost_model(
    vocab: int, dim: int, local_items: int, batch: int, bytes_per_value: int = 4
) -> dict[str, float]:
    """Per-client costs of the movie-recommendation experiment (Augenstein et al. 2022
    App. C.3, docs/explanation/algorithms.md §5.9): compute in flop for one local step,
    communication in KiB.

    client = |𝓑|d + 3|𝓑|d² + 3|𝓑|²d + 2|𝓑|;  baseline = client + ½N²d + Nd;
    communication: baseline 2Nd values, PT 2nd, gradient transfer 3nd.
    """
    client = batch * dim + 3 * batch * dim**2 + 3 * batch**2 * dim + 2 * batch
    baseline = client + 0.5 * vocab**2 * dim + vocab * dim
    kib = bytes_per_value / 1024
    return {
        "client_flop": float(client),
        "baseline_flop": float(baseline),
        "compute_saving": 1.0 - client / baseline,
        "baseline_kib": 2 * vocab * dim * kib,
        "pt_kib": 2 * local_items * dim * kib,
        "gt_kib": 3 * local_items * dim * kib,
    }


def _builder(variant: Variant | None):
    def build(recipe: Recipe, hp: Any, local_steps: int, task: Task) -> MixedFL:
        if task.central is None:
            raise ConfigError(
                "task",
                f"algorithm {recipe.name!r} needs a task with central data "
                "(e.g. mixed_labels or mixed_quadratic)",
            )
        return MixedFL(
            recipe.name, variant or hp.mixed_variant, local_steps, make_server_opt(hp), hp
        )

    return build


#: the rounds of the recipes ``mixed_pt``, ``mixed_gt1``, ``mixed_gt2`` and ``mixed_fl`` (the
#: variant a hyperparameter; :mod:`.extensions`)
build_pt = _builder("pt")
build_gt1 = _builder("gt1")
build_gt2 = _builder("gt2")
build_any = _builder(None)
