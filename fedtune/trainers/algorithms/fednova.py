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
Θ_{1:τ_i} with optional α, any server optimizer) with :func:`normalized_averaging` as its
aggregator, which reads α (``aggregator_hparams``). Its form over a pack's stacked members,
:func:`packed_normalized_averaging`, lets configurations share a pack, members differing in α
too. Round diagnostic: ``fednova_tau_eff``.
"""

from __future__ import annotations

import torch

from .base import Params, members_weighted_mean, weighted_mean
from .extensions import FEDNOVA_PAPER as PAPER

__all__ = ["PAPER", "normalized_averaging", "packed_normalized_averaging", "step_weight_norms"]


def step_weight_norms(
    steps: torch.Tensor, client_lr: float | torch.Tensor, prox_alpha: float | torch.Tensor
) -> torch.Tensor:
    """‖a_i‖₁ (float64): τ_i for SGD, Σ_{j<τ_i} (1 − γα)^j with the proximal term.

    Args:
        steps: The clients' local steps τ_i, ``[M]`` (or ``[P, M]``).
        client_lr: γ_t, a number (or ``[P, 1]``, one per member).
        prox_alpha: α, a number (or ``[P, 1]``).

    Returns:
        The norms, shaped like ``steps``.
    """
    tau = steps.to(torch.float64)
    rho = 1.0 - torch.as_tensor(client_lr, dtype=torch.float64) * torch.as_tensor(
        prox_alpha, dtype=torch.float64
    )
    proximal = (1.0 - torch.pow(rho, tau)) / (1.0 - rho)  # not finite where ρ = 1: not taken
    return torch.where(rho == 1.0, tau, proximal)


def normalized_averaging(
    messages: Params,
    weights: torch.Tensor,
    steps: torch.Tensor,
    client_lr: float,
    prox_alpha: float = 0.0,
) -> tuple[Params, dict[str, float]]:
    """The FedNova aggregator: q = τ_eff Σ_i p_i q_i/‖a_i‖₁ with τ_eff = Σ_i p_i ‖a_i‖₁.

    Args:
        messages: The clients' messages q_i ``[M, ...]``.
        weights: Their weights p_i ``[M]``.
        steps: Their local steps τ_i ``[M]``.
        client_lr: γ_t.
        prox_alpha: The proximal term's α.

    Returns:
        q and ``fednova_tau_eff``.
    """
    norms = step_weight_norms(steps.cpu(), client_lr, prox_alpha).to(weights.device)
    p = weights.to(torch.float64)
    tau_eff = (p * norms).sum()
    scaled = (p * tau_eff / norms).to(weights.dtype)  # p_i τ_eff / ‖a_i‖₁
    return weighted_mean(messages, scaled), {"fednova_tau_eff": float(tau_eff)}


def packed_normalized_averaging(
    messages: Params,
    weights: torch.Tensor,
    steps: torch.Tensor,
    client_lr: torch.Tensor,
    prox_alpha: torch.Tensor,
) -> tuple[Params, dict[str, torch.Tensor]]:
    """:func:`normalized_averaging` of every member of a pack at once.

    Args:
        messages: The members' clients' messages ``[P, M, ...]``.
        weights: The cohort's weights p_i ``[M]``.
        steps: Each member's clients' local steps ``[P, M]``.
        client_lr: Each member's γ_t ``[P]``.
        prox_alpha: Each member's α ``[P]`` (float64).

    Returns:
        The updates ``[P, ...]`` and ``fednova_tau_eff`` ``[P]``.
    """
    norms = step_weight_norms(
        steps.cpu(), client_lr.cpu().unsqueeze(1), prox_alpha.cpu().unsqueeze(1)
    ).to(weights.device)
    p = weights.to(torch.float64)
    tau_eff = (p * norms).sum(1, keepdim=True)  # [P, 1]
    scaled = (p * tau_eff / norms).to(weights.dtype)  # [P, M]
    return members_weighted_mean(messages, scaled), {"fednova_tau_eff": tau_eff.squeeze(1)}
