"""FedNova: normalized averaging for heterogeneous local work.

Source: J. Wang, Q. Liu, H. Liang, G. Joshi, H. V. Poor, *Tackling the Objective Inconsistency
Problem in Heterogeneous Federated Optimization*, NeurIPS 2020 (arXiv:2007.07481; not one of
the papers docs/explanation/algorithms.md is built on).

Client i runs τ_i local steps (``train.local_epochs``: τ_i = ⌈E·n_i/B⌉) and sends, in the
gradient units of LocalUpdate (Θ_{1:τ_i}, docs/explanation/algorithms.md §1.3, §1.6)::

    q_i = Σ_k a_{i,k} ∇f_i(y_{i,k}; batch k) = (x − y_{i,τ_i}) / γ          (= G_i a_i)

With plain local SGD a_i = (1, …, 1); with the proximal term α of FedProx
a_{i,k} = (1 − γα)^{τ_i−1−k}. FedAvg averages q = Σ_i p_i q_i, so a client that runs more steps
counts more: for small γ, q ≈ Σ_i p_i τ_i ∇f_i(x), and FedAvg converges to a stationary point of
the *surrogate* F̃ = Σ_i (p_i τ_i / Σ_j p_j τ_j) f_i instead of F = Σ_i p_i f_i (the paper's
objective inconsistency, its Theorem 1). FedNova (its eq. 9) normalises every client's update
by ‖a_i‖₁ and rescales the average by the effective number of steps::

    d_i   = q_i / ‖a_i‖₁        ‖a_i‖₁ = τ_i (SGD);  [1 − (1 − γα)^{τ_i}] / (γα) (proximal)
    τ_eff = Σ_i p_i ‖a_i‖₁
    q     = τ_eff · Σ_i p_i d_i ;      x ← ServerOpt(x, q, η)   (paper: SGD, η = γ)

so for small γ, q ≈ τ_eff ∇F(x): F's stationary points are fixed points, whatever the τ_i.
With equal step counts (τ_i = τ for all i) q = Σ_i p_i q_i exactly: FedNova ≡ FedAvg (with any
server optimizer). p_i are the cohort's aggregation weights: the paper's p_i = n_i/n is
``train.weighting: examples``; ``uniform`` gives F = mean_i f_i.

FedNova is a recipe of existing parts: :class:`~.local_update.LocalUpdate` (client rule
Θ_{1:τ_i} with optional α, any server optimizer) with :class:`NormalizedAveraging` as its
aggregator. Round diagnostic: ``fednova_tau_eff``.
"""

from __future__ import annotations

from typing import Any

import torch

from ..tasks.base import Task
from .base import Params, weighted_mean
from .local_update import LocalUpdate
from .recipe import SERVER_PARAMS, Recipe, _build_local_update
from .registry import register

__all__ = ["PAPER", "NormalizedAveraging", "step_weight_norms"]

PAPER = "Wang et al. 2020, arXiv:2007.07481 (FedNova)"


def step_weight_norms(steps: torch.Tensor, client_lr: float, prox_alpha: float) -> torch.Tensor:
    """‖a_i‖₁ [M] (float64): τ_i for SGD, Σ_{j<τ_i} (1 − γα)^j with the proximal term."""
    tau = steps.to(torch.float64)
    rho = 1.0 - client_lr * prox_alpha
    if rho == 1.0:
        return tau
    return (1.0 - torch.pow(torch.tensor(rho, dtype=torch.float64), tau)) / (1.0 - rho)


class NormalizedAveraging:
    """The FedNova aggregator: q = τ_eff Σ_i p_i q_i/‖a_i‖₁ with τ_eff = Σ_i p_i ‖a_i‖₁."""

    def __init__(self, prox_alpha: float = 0.0) -> None:
        self.prox_alpha = prox_alpha

    def __call__(
        self, messages: Params, weights: torch.Tensor, steps: torch.Tensor, client_lr: float
    ) -> tuple[Params, dict[str, float]]:
        norms = step_weight_norms(steps.cpu(), client_lr, self.prox_alpha).to(weights.device)
        p = weights.to(torch.float64)
        tau_eff = (p * norms).sum()
        scaled = (p * tau_eff / norms).to(weights.dtype)  # p_i τ_eff / ‖a_i‖₁
        return weighted_mean(messages, scaled), {"fednova_tau_eff": float(tau_eff)}


def _build_fednova(recipe: Recipe, hp: Any, local_steps: int, task: Task) -> LocalUpdate:
    base = _build_local_update(recipe, hp, local_steps, task)
    return LocalUpdate(recipe.name, base.rule, base.server_opt, NormalizedAveraging(hp.prox_alpha))


register(
    Recipe(
        "fednova",
        "FedNova: normalized averaging of heterogeneous local work, q = τ_eff Σ p_i q_i/‖a_i‖₁",
        PAPER,
        ("client_lr", "prox_alpha", *SERVER_PARAMS),
        build=_build_fednova,
    )
)
