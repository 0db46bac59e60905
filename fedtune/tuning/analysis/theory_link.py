"""Predicted (ρ, Δ) of a trial configuration on a quadratic task
(Charles & Konečný 2021 (arXiv:2103.05032)).

For a LocalUpdate-family configuration (Θ_1:K or Θ_K, proximal α, client lr γ, local steps K)
on the ``quadratic`` task with its exact instance (A_i, c_i, p_i):

* κ(α, γ, Θ) = L̃/μ̃ from the explicit eigenvalues of Q_i A_i (eq. 9);
* Δ where Theorem 4 holds (Θ_1:K with γ < 1/(L+α), Θ_K with γ < 1/(KL+α)): eq. 17,
  Δ = (√κ₀ − √κ)/(√κ₀ + √κ), κ₀ = L/μ. For Θ_K with 1/(KL+α) ≤ γ < 1/(L+α), App. D.1
  prescribes Lemma 5 instead (eq. 17 turns negative there once κ > κ₀): Δ = (√b − √a)/(√b + √a),
  b = max_i λ_max(Q_i), a = min_i λ_min(Q_i) — what ``fedtune frontier --simulated`` plots
  (docs/explanation/algorithms.md §3.11 item 4). Both forms lie in [0, 1];
* ρ of *this* configuration's server: for ``sgd`` with step η on the full-participation
  surrogate f̃ (Hessian H = Σ p_i Q_i A_i), ρ = max_j |1 − η λ_j(H)|; for momentum servers
  the rate of the tuned optimizer of Table 2 (heavy-ball / Nesterov), a lower bound;
* the surrogate minimiser's loss f(x*(α, γ, Θ)) − f(x*), the limit a stable run approaches
  (NaN when E[Q_i A_i] is singular in float64, e.g. Θ_K with K in the hundreds near γ = 1/L).

Configurations outside the theory (other algorithms, adaptive servers, γ ≥ 1/(L+α)) get no
prediction (``None``) rather than a wrong one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedtune.errors import ConfigError
from fedtune.trainers import TrialConfig, build_task, get_recipe
from fedtune.trainers.algorithms.recipe import LOCAL_UPDATE_ROUND
from fedtune.trainers.algorithms.registry import effective_hparams, local_steps_of
from fedtune.trainers.theory import (
    QuadraticInstance,
    delta_eq17,
    delta_lemma5,
    rate,
    theta_last,
    theta_sum,
)
from fedtune.trainers.theory.rates import log_q_extremes
from fedtune.trainers.theory.surrogate import (
    distortion_matrices,
    surrogate_minimizer,
    surrogate_spectrum,
)

from ..spec import StudySpec

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
    delta_form: str = "eq17"  # "eq17" (Theorem 4 regime) or "lemma5" (Θ_K, γ ≥ 1/(KL+α))


def _delta(
    instance: QuadraticInstance, alpha: float, gamma: float, theta_family: str, K: int, log_kappa
) -> tuple[float, str]:
    """Δ and the form used: eq. 17 inside Theorem 4's conditions, Lemma 5 outside (App. D.1)."""
    if theta_family == "last" and gamma >= 1.0 / (K * instance.L + alpha):
        log_b, log_a = log_q_extremes(instance, alpha, gamma, _THETA[theta_family](K))
        return float(delta_lemma5(log_b, log_a)), "lemma5"
    return float(delta_eq17(log_kappa, np.log(instance.L / instance.mu))), "eq17"


def predict(cfg: TrialConfig, instance: QuadraticInstance) -> Prediction | None:
    """The prediction for one trial configuration, or None when the theory does not apply."""
    recipe = get_recipe(cfg.algorithm)
    if recipe.round_form != LOCAL_UPDATE_ROUND or recipe.aggregator or recipe.second_order:
        return None  # the theory is of the plain LocalUpdate round with the weighted mean
    if recipe.theta not in _THETA or cfg.hparams.get("theta") or cfg.train.local_epochs is not None:
        return None  # the theory needs one Θ (one K) for every client
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
    except ConfigError:
        return None
    delta, form = _delta(instance, alpha, gamma, recipe.theta, K, spec.log_kappa)
    try:
        x_lim = surrogate_minimizer(instance, alpha, gamma, theta)
        excess = instance.loss(x_lim) - instance.loss(instance.x_star())
    except (ConfigError, np.linalg.LinAlgError):  # E[Q_i A_i] singular in float64 (κ ≳ 1e16)
        excess = float("nan")
    if hp.server_opt == "sgd":
        Q = distortion_matrices(instance.A, alpha, gamma, theta)
        H = np.einsum("i,ijk->jk", instance.p, Q @ instance.A)
        lam = np.linalg.eigvals(H).real
        rho = float(np.max(np.abs(1.0 - hp.server_lr * lam)))
        return Prediction(rho, delta, spec.kappa, float(excess), "configured", form)
    rho = float(rate(spec.kappa, _MOMENTUM[hp.server_opt]))
    return Prediction(rho, delta, spec.kappa, float(excess), "tuned", form)


def theory_report(spec: StudySpec, curves: list, directory: Path) -> dict[str, Path]:
    """On a ``quadratic`` task: each configuration's predicted (ρ, Δ) beside its measured
    contraction and limit, as ``theory.png`` and ``theory.json``.

    The measured rate fits ℓ_t − ℓ_∞ ∝ ρ^t (exponent 1: the limit x*(α, γ, Θ) is not the
    optimum, so the loss gap is linear in the distance to it)."""
    if spec.task.name != "quadratic":
        return {}
    from .plots import plot_theory, theory_table  # matplotlib: only for this report

    instance = build_task("quadratic", dict(spec.task.params), spec.task.seed).meta["instance"]
    predicted, forms = {}, {}
    for c in curves:
        p = predict(spec.trial(dict(c.params)), instance)
        if p is not None:
            predicted[c.trial_id] = (p.rho, p.delta)
            forms[c.trial_id] = p.delta_form
    rows = theory_table(
        curves, predicted, last_rounds=spec.objective.last_rounds, loss_exponent=1.0
    )
    if not rows:
        return {}
    out = {"theory": plot_theory(rows, directory / "theory.png")}
    table = [
        {
            "trial": r.trial_id,
            "rho_predicted": r.rho_predicted,
            "delta_predicted": r.delta_predicted,
            "delta_form": forms[r.trial_id],
            "rho_measured": r.rho_measured,
            "final_loss": r.final_loss,
            "params": dict(r.params),
        }
        for r in rows
    ]
    (directory / "theory.json").write_text(json.dumps(table, indent=2, default=str))
    out["theory_table"] = directory / "theory.json"
    return out
