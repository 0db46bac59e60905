"""Predicted (ρ, Δ) of a trial configuration on a quadratic task (`000_4bdc3753d62a87e2.txt`).

For a LocalUpdate-family configuration (Θ_1:K or Θ_K, proximal α, client lr γ, local steps K)
on the ``quadratic`` task with its exact instance (A_i, c_i, p_i):

* κ(α, γ, Θ) = L̃/μ̃ from the explicit eigenvalues of Q_i A_i (eq. 9) and
  Δ = (√κ₀ − √κ)/(√κ₀ + √κ) (eq. 17), κ₀ = L/μ;
* ρ of *this* configuration's server: for ``sgd`` with step η on the full-participation
  surrogate f̃ (Hessian H = Σ p_i Q_i A_i), ρ = max_j |1 − η λ_j(H)|; for momentum servers
  the rate of the tuned optimizer of Table 2 (heavy-ball / Nesterov), a lower bound;
* the surrogate minimiser's loss f(x*(α, γ, Θ)) − f(x*), the limit a stable run approaches.

Configurations outside the theory (other algorithms, adaptive servers, γ ≥ 1/(L+α)) get no
prediction (``None``) rather than a wrong one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedtune.errors import ConfigError
from fedtune.trainers import build_task, get_recipe, parse_trial_config
from fedtune.trainers.algorithms.registry import effective_hparams, local_steps_of
from fedtune.trainers.theory import QuadraticInstance, delta_eq17, rate, theta_last, theta_sum
from fedtune.trainers.theory.surrogate import (
    distortion_matrices,
    surrogate_minimizer,
    surrogate_spectrum,
)

from .plots import plot_theory, theory_table
from .spec import StudySpec

__all__ = ["Prediction", "predict", "theory_report"]

_THETA = {"sum": theta_sum, "last": theta_last}
_MOMENTUM = {"momentum": "heavy_ball", "nesterov": "nesterov"}


@dataclass(frozen=True)
class Prediction:
    rho: float
    delta: float
    kappa: float
    limit_excess_loss: float
    rho_kind: str  # "configured" (this η) or "tuned" (Table 2 optimum)


def predict(config: Mapping[str, Any], instance: QuadraticInstance) -> Prediction | None:
    """The prediction for one trial configuration, or None when the theory does not apply."""
    cfg = parse_trial_config(config)
    recipe = get_recipe(cfg.algorithm)
    if recipe.build.__name__ != "_build_local_update" or recipe.second_order:
        return None
    if recipe.theta not in _THETA or cfg.hparams.theta:
        return None
    hp = effective_hparams(recipe, cfg)
    if hp.server_opt not in ("sgd", *_MOMENTUM):
        return None
    K = local_steps_of(recipe, cfg)
    theta = _THETA[recipe.theta](K)
    alpha, gamma = hp.prox_alpha, hp.client_lr
    if recipe.units == "delta":
        return None
    try:
        spec = surrogate_spectrum(instance, alpha, gamma, theta)
        x_lim = surrogate_minimizer(instance, alpha, gamma, theta)
    except ConfigError:
        return None
    delta = float(delta_eq17(spec.log_kappa, np.log(instance.L / instance.mu)))
    excess = instance.loss(x_lim) - instance.loss(instance.x_star())
    if hp.server_opt == "sgd":
        Q = distortion_matrices(instance.A, alpha, gamma, theta)
        H = np.einsum("i,ijk->jk", instance.p, Q @ instance.A)
        lam = np.linalg.eigvals(H).real
        rho = float(np.max(np.abs(1.0 - hp.server_lr * lam)))
        return Prediction(rho, delta, spec.kappa, float(excess), "configured")
    rho = float(rate(spec.kappa, _MOMENTUM[hp.server_opt]))
    return Prediction(rho, delta, spec.kappa, float(excess), "tuned")


def theory_report(spec: StudySpec, curves: list, directory: Path) -> dict[str, Path]:
    """On a ``quadratic`` task: each configuration's predicted (ρ, Δ) beside its measured
    contraction and limit, as ``theory.png`` and ``theory.json``.

    The measured rate fits ℓ_t − ℓ_∞ ∝ ρ^t (exponent 1: the limit x*(α, γ, Θ) is not the
    optimum, so the loss gap is linear in the distance to it)."""
    if spec.task.get("name") != "quadratic":
        return {}
    params = {k: v for k, v in spec.task.items() if k not in ("name", "seed")}
    instance = build_task("quadratic", params, spec.task.get("seed", 0)).meta["instance"]
    predicted = {}
    for c in curves:
        p = predict(spec.trial_config(dict(c.params)), instance)
        if p is not None:
            predicted[c.trial_id] = (p.rho, p.delta)
    rows = theory_table(curves, predicted, last_rounds=spec.objective.last_rounds,
                        loss_exponent=1.0)  # fmt: skip
    if not rows:
        return {}
    out = {"theory": plot_theory(rows, directory / "theory.png")}
    table = [{"trial": r.trial_id, "rho_predicted": r.rho_predicted,
              "delta_predicted": r.delta_predicted, "rho_measured": r.rho_measured,
              "final_loss": r.final_loss, "params": dict(r.params)} for r in rows]  # fmt: skip
    (directory / "theory.json").write_text(json.dumps(table, indent=2, default=str))
    out["theory_table"] = directory / "theory.json"
    return out
