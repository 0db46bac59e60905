"""FedAvg with MaSS acceleration (Qu et al. 2020 (arXiv:2007.05690),
docs/explanation/algorithms.md §6).

Every round is one communication period of E = K local steps on mini-batches of m examples
(with ``train.local_epochs``, device i runs its own τ_i steps; masked steps leave w, v, u
unchanged); each device keeps its own momentum sequence across rounds. Form 2 (the one the proof analyses,
default ``mass_form: form2``), with step η, momentum weight α and δ::

    g_t = ∇F_k(u_t; ξ_t)        (``mass_grad_point: u``; ``w`` gives the note's literal ∇F_k(w_t))
    v_{t+1} = (1 − α) v_t + α u_t − δ g_t          (u_t, not the note's w_t: §9 item 17)
    w_{t+1} = u_t − η g_t                           (averaged over the cohort after step E)
    u_{t+1} = (α v_{t+1} + w_{t+1}) / (1 + α)

Only w is averaged; v stays on the device and u is recomputed from the average. Form 1 (step
sizes η₁, η₂, momentum γ) is the same recursion between communications::

    w_{t+1} = u_t − η₁ g_t;    u_{t+1} = w_{t+1} + γ (w_{t+1} − w_t) + η₂ g_t

with γ = (1 − α)/(1 + α), η₁ = η, η₂ = (η − αδ)/(1 + α). At a communication step ``form1``
applies the sync rule of form 2, u ← u_loc + ((1 + γ)/2)(w̄ − w_loc), so it equals form 2;
``form1_literal`` (recipe ``fedavg_mass_literal``) is the note's literal rule
u = w̄ + γ(w̄ − w_t) + η₂ g, i.e. a correction (1 + γ)(w̄ − w_loc), which can diverge (§6.4).

Hyperparameters: η₁ = ``client_lr``, η₂ = ``mass_eta2``, γ = ``mass_gamma`` (α, δ derived);
η₂ = 0 is FedAvg with local Nesterov momentum (recipe ``fedavg_nesterov``). ``mass_auto``
replaces all three by the theorem's choice η = 1/L_m, α = 1/√(κ_m κ̃_m), δ = η/(α κ̃_m) from
the constants of the task's per-device data (linear regression tasks, e.g. ``linreg_interp``),
taking the worst device (largest L_m and κ̃_m, smallest μ) so that all devices share them.
With ``mass_auto: true`` the configuration may not also set ``client_lr``, ``mass_gamma`` or
``mass_eta2``, nor enable LocalUpdateDecay (it would decay γ = η₁, which the theorem fixes): each
is an error naming the field, never silently ignored. The effective η₁, η₂, γ, α, δ are
reported in every round record, η₁ also as the record's ``client_lr``, and the record's
``server_lr`` is the 1.0 in force (the server model is the plain average).

State (``ServerState.extra["mass_state"]``): a client table (see :mod:`.scaffold`) holding v
(form 2) or u (form 1) of every device seen; a device's first round starts at v = u = w̄ (no
momentum), which is the note's initialisation u_0 = v_0 = w_0 in the first round. The server
model is the plain average w̄ = Σ_k p_k w_E^k (server_lr fixed to 1). The note assumes full
participation, where ``form1`` ≡ ``form2``; under partial participation a returning device
recomputes u from its kept v and the *current* average (form 2) or reuses its kept u (form 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from fedtune.errors import ConfigError

from ..func_grad import grad
from ..part_hparams import MASS_HPARAMS
from ..steps import where_step
from ..tasks.base import Task
from .base import Cohort, RoundContext, ServerState, tree_norm, weighted_mean
from .recipe import Recipe
from .scaffold import table_gather, table_init, table_scatter

__all__ = [
    "MASS_HPARAMS",
    "FedAvgMaSS",
    "MassConstants",
    "device_constants",
    "form1_from_form2",
    "form2_from_form1",
    "theorem_steps",
]

Params = dict[str, torch.Tensor]
Form = Literal["form2", "form1", "form1_literal"]


@dataclass(frozen=True)
class MassConstants:
    """Constants of one device's data for mini-batches of m examples
    (docs/explanation/algorithms.md §6.2)."""

    L: float  # largest eigenvalue of H
    mu: float  # smallest non-zero eigenvalue of H
    L1: float  # E[‖x‖² x xᵀ] ⪯ L_1 H
    kappa_tilde: float  # E[(xᵀH⁺x) x xᵀ] ⪯ κ̃ H
    m: int

    @property
    def Lm(self) -> float:
        return self.L1 / self.m + (self.m - 1) * self.L / self.m

    @property
    def kappa_m(self) -> float:
        return self.Lm / self.mu

    @property
    def kappa_tilde_m(self) -> float:
        return self.kappa_tilde / self.m + (self.m - 1) / self.m


def device_constants(X: np.ndarray, m: int, rtol: float = 1e-10) -> MassConstants:
    """L, μ, L_1, κ̃ of features ``X`` [n, d] (x̃ uniform over the rows), on range(H)."""
    n = X.shape[0]
    H = X.T @ X / n
    lam, V = np.linalg.eigh(H)
    keep = lam > rtol * lam.max()
    root = V[:, keep] / np.sqrt(lam[keep])  # H^{+½} restricted to range(H)
    sq = np.einsum("ij,ij->i", X, X)
    hinv = np.einsum("ij,ij->i", X @ root, X @ root)  # xᵀ H⁺ x
    S1, S2 = (X.T * sq) @ X / n, (X.T * hinv) @ X / n
    top = lambda S: float(np.linalg.eigvalsh(root.T @ S @ root).max())  # noqa: E731
    return MassConstants(float(lam.max()), float(lam[keep].min()), top(S1), top(S2), m)


def theorem_steps(
    devices: list[MassConstants], nesterov: bool = False
) -> tuple[float, float, float]:
    """(η, α, δ) of the theorem with the worst device's constants (δ = η/α for Nesterov)."""
    Lm = max(c.Lm for c in devices)
    mu = min(c.mu for c in devices)
    kt = max(c.kappa_tilde_m for c in devices)
    eta = 1.0 / Lm
    alpha = 1.0 / math.sqrt(Lm / mu * kt)
    return eta, alpha, (eta / alpha if nesterov else eta / (alpha * kt))


def form1_from_form2(eta: float, alpha: float, delta: float) -> tuple[float, float, float]:
    """(η₁, η₂, γ) = (η, (η − αδ)/(1 + α), (1 − α)/(1 + α))."""
    return eta, (eta - alpha * delta) / (1 + alpha), (1 - alpha) / (1 + alpha)


def form2_from_form1(eta1: float, eta2: float, gamma: float) -> tuple[float, float, float]:
    """(η, α, δ) with α = (1 − γ)/(1 + γ), δ = (η₁ − (1 + α)η₂)/α."""
    alpha = (1 - gamma) / (1 + gamma)
    return eta1, alpha, (eta1 - (1 + alpha) * eta2) / alpha


def _client_fn(loss_of, steps: int, form: Form, at_u: bool, eta, alpha, delta, eta2, gamma):
    """``fn(x, xb, yb, state[, mask]) -> {w, s}``; a step with ``mask[k]`` unset (heterogeneous
    local work) leaves w, v and u bit for bit unchanged."""
    gradient = grad(loss_of)

    def keep(mask, k, new: tuple, old: tuple) -> tuple:
        if mask is None:
            return new
        return tuple(where_step(mask[k], a, b) for a, b in zip(new, old, strict=True))

    def form2(x: Params, xb, yb, v: Params, mask=None) -> dict:
        w = x
        u = {k: (alpha * v[k] + x[k]) / (1 + alpha) for k in x}
        for s in range(steps):
            g = gradient(u if at_u else w, xb[s], yb[s])
            v_n = {k: (1 - alpha) * v[k] + alpha * u[k] - delta * g[k] for k in x}
            w_n = {k: u[k] - eta * g[k] for k in x}
            u_n = {k: (alpha * v_n[k] + w_n[k]) / (1 + alpha) for k in x}
            v, w, u = keep(mask, s, (v_n, w_n, u_n), (v, w, u))
        return {"w": w, "s": v}

    def form1(x: Params, xb, yb, u: Params, mask=None) -> dict:
        w = x
        for s in range(steps):
            g = gradient(u if at_u else w, xb[s], yb[s])
            w_new = {k: u[k] - eta * g[k] for k in x}
            u_n = {k: w_new[k] + gamma * (w_new[k] - w[k]) + eta2 * g[k] for k in x}
            u, w = keep(mask, s, (u_n, w_new), (u, w))
        return {"w": w, "s": u}

    return form2 if form == "form2" else form1


class FedAvgMaSS:
    """FedAvg whose devices run MaSS (η₂ > 0) or Nesterov (η₂ = 0); see module docstring."""

    def __init__(
        self,
        name: str,
        local_steps: int,
        params: Any,
        nesterov: bool = False,
        features: list[np.ndarray] | None = None,
    ) -> None:
        self.name = name
        self.local_steps = local_steps
        self.p = params
        self.nesterov = nesterov
        self.features = features
        self._auto: dict[int, tuple[float, float, float]] = {}

    def num_batches(self) -> int:
        return self.local_steps

    def init(self, params: Params) -> ServerState:
        return ServerState(params=params, opt_state={}, extra={"mass_state": table_init(params)})

    def broadcast(self, state: ServerState) -> Params:
        return state.params

    def steps(self, client_lr: float, m: int) -> tuple[float, float, float, float, float]:
        """(η, α, δ, η₂, γ) in force for batch size m."""
        if self.p.mass_auto:
            if m not in self._auto:
                self._auto[m] = theorem_steps(
                    [device_constants(X, m) for X in self.features], self.nesterov
                )
            eta, alpha, delta = self._auto[m]
            _, eta2, gamma = form1_from_form2(eta, alpha, delta)
            return eta, alpha, delta, (0.0 if self.nesterov else eta2), gamma
        eta2 = 0.0 if self.nesterov else self.p.mass_eta2
        eta, alpha, delta = form2_from_form1(client_lr, eta2, self.p.mass_gamma)
        return eta, alpha, delta, eta2, self.p.mass_gamma

    def apply(self, state: ServerState, cohort: Cohort, ctx: RoundContext):
        x = state.params
        eta, alpha, delta, eta2, gamma = self.steps(ctx.client_lr, int(cohort.batches.shape[2]))
        form = self.p.mass_form
        fn = _client_fn(
            ctx.loss_of,
            cohort.k_max(self.local_steps),
            form,
            self.p.mass_grad_point == "u",
            eta,
            alpha,
            delta,
            eta2,
            gamma,
        )
        own = table_gather(state.extra["mass_state"], cohort.clients, x)
        rows = cohort.batches
        per_client = (ctx.data.inputs[rows], ctx.data.targets[rows], own)
        if cohort.steps is not None:
            per_client += (cohort.mask(),)
        out = ctx.runner.map(fn, (x,), per_client)
        w_bar = weighted_mean(out["w"], cohort.weights)
        kept = out["s"]
        if form != "form2":  # sync rule: u ← u_loc + c (w̄ − w_loc)
            c = (1 + gamma) / 2 if form == "form1" else 1 + gamma
            kept = {k: kept[k] + c * (w_bar[k].unsqueeze(0) - out["w"][k]) for k in kept}
        table = table_scatter(state.extra["mass_state"], cohort.clients, kept)
        diag = {
            "update_norm": tree_norm({k: w_bar[k] - x[k] for k in x}),
            "client_lr": eta,  # the rates in force, recorded instead of the configured ones
            "server_lr": 1.0,
            "comm_vectors": 2.0,
            "mass_eta1": eta,
            "mass_eta2": eta2,
            "mass_gamma": gamma,
            "mass_alpha": alpha,
            "mass_delta": delta,
        }
        return ServerState(w_bar, {}, {**state.extra, "mass_state": table}), diag


def _builder(nesterov: bool):
    def build(recipe: Recipe, hp: Any, local_steps: int, task: Task) -> FedAvgMaSS:
        features = None
        if hp.mass_auto:
            if not task.meta.get("linear_regression"):
                raise ConfigError(
                    "hparams.mass_auto",
                    "needs a linear-regression task whose inputs "
                    "are the features (e.g. linreg_interp)",
                )
            data = task.train
            features = [
                data.client(i).inputs.double().cpu().numpy() for i in range(data.num_clients)
            ]
        return FedAvgMaSS(recipe.name, local_steps, hp, nesterov, features)

    return build


#: the rounds of the recipes ``fedavg_mass`` and ``fedavg_mass_literal`` (MaSS), and
#: ``fedavg_nesterov`` (:mod:`.extensions`)
build_mass = _builder(False)
build_nesterov = _builder(True)
