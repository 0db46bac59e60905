"""Convergence rates ρ, suboptimality Δ and distance bounds
(docs/explanation/algorithms.md §3.7–3.9).

Rates on the surrogate with condition number κ = L̃/μ̃ (Charles & Konečný 2021 (arXiv:2103.05032)
Thm 3, Table 2; tunings from Lessard et al. 2016, Prop. 1 — docs/explanation/algorithms.md
**[DERIVED]**):

    GD          ρ = (κ−1)/(κ+1) = tanh(½ ln κ)      η = 2/(L̃+μ̃)
    Nesterov    ρ = 1 − 2/√(3κ+1)                   η = 4/(3L̃+μ̃),  β = (√(3κ+1)−2)/(√(3κ+1)+2)
    heavy-ball  ρ = (√κ−1)/(√κ+1) = tanh(¼ ln κ)    η = 4/(√L̃+√μ̃)², β = ρ²

Suboptimality (Charles & Konečný 2021 eq. 17 and Lemma 5):

    Δ₁₇ = (√κ₀ − √κ)/(√κ₀ + √κ) = tanh(¼ ln(κ₀/κ)),    Δ_L5 = (√b − √a)/(√b + √a)

with b = max_i λ_max(Q_i), a = min_i λ_min(Q_i). Everything accepts log κ so that simulated
MAML frontiers with κ ≈ e^{9000} stay finite. Distance bounds: Lemma 5 / Thm 4 of
Charles & Konečný 2021; Thms 16, 17, 21, Cors 20, 22 and Lemma 23 of
Charles & Konečný 2020 (arXiv:2007.00878).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from fedtune.errors import ConfigError

from .instances import QuadraticInstance
from .surrogate import Theta, check_client_lr, log_q, phi

__all__ = [
    "ServerOpt",
    "TunedServer",
    "bound_cor20",
    "bound_cor22",
    "bound_lemma5",
    "bound_thm4",
    "bound_thm16",
    "bound_thm17",
    "bound_thm21",
    "chi",
    "delta_eq17",
    "delta_lemma5",
    "heterogeneity",
    "log_q_extremes",
    "message_variance_bound",
    "rate",
    "rate_from_log_kappa",
    "tuned_server",
]


class ServerOpt(StrEnum):
    GD = "gd"
    NESTEROV = "nesterov"
    HEAVY_BALL = "heavy_ball"


def rate_from_log_kappa(log_kappa, server_opt: ServerOpt | str) -> np.ndarray:
    """ρ(κ) of Table 2 from ℓ = log κ ≥ 0 (stable for ℓ → ∞: ρ → 1)."""
    ell = np.asarray(log_kappa, float)
    opt = ServerOpt(server_opt)
    if opt is ServerOpt.GD:
        return np.tanh(ell / 2)
    if opt is ServerOpt.HEAVY_BALL:
        return np.tanh(ell / 4)
    # 1 − 2/√(3κ + 1) with √(3κ+1) = exp(½(ℓ + log(3 + e^{−ℓ})))
    return 1.0 - 2.0 * np.exp(-0.5 * (ell + np.log(3.0 + np.exp(-ell))))


def rate(kappa, server_opt: ServerOpt | str) -> np.ndarray:
    """ρ(κ) of Table 2; κ ≥ 1."""
    kappa = np.asarray(kappa, float)
    if np.any(kappa < 1):
        raise ConfigError("kappa", "condition number must be >= 1")
    return rate_from_log_kappa(np.log(kappa), server_opt)


@dataclass(frozen=True)
class TunedServer:
    """The ServerOpt parameters that attain ``rate`` on a μ̃-strongly convex, L̃-smooth quadratic."""

    server_opt: ServerOpt
    server_lr: float
    server_momentum: float
    rate: float


def tuned_server(mu_tilde: float, L_tilde: float, server_opt: ServerOpt | str) -> TunedServer:
    """η, β and ρ of the §3.7 table for the surrogate constants μ̃ ≤ L̃."""
    if not 0 < mu_tilde <= L_tilde:
        raise ConfigError("mu_tilde", f"need 0 < mu_tilde <= L_tilde, got {mu_tilde}, {L_tilde}")
    opt = ServerOpt(server_opt)
    kappa = L_tilde / mu_tilde
    rho = float(rate(kappa, opt))
    if opt is ServerOpt.GD:
        return TunedServer(opt, 2.0 / (L_tilde + mu_tilde), 0.0, rho)
    if opt is ServerOpt.NESTEROV:
        s = np.sqrt(3 * kappa + 1)
        return TunedServer(opt, 4.0 / (3 * L_tilde + mu_tilde), float((s - 2) / (s + 2)), rho)
    lr = 4.0 / (np.sqrt(L_tilde) + np.sqrt(mu_tilde)) ** 2
    return TunedServer(opt, float(lr), rho**2, rho)


def delta_eq17(log_kappa, log_kappa0) -> np.ndarray:
    """Δ = tanh(¼(ln κ₀ − ln κ)) (eq. 17); negative when κ > κ₀ (§3.11 [AMBIGUITY])."""
    return np.tanh((np.asarray(log_kappa0, float) - np.asarray(log_kappa, float)) / 4)


def delta_lemma5(log_b, log_a) -> np.ndarray:
    """Δ_L5 = (√b − √a)/(√b + √a) = tanh(¼ ln(b/a)) from log b = log max λ(Q), log a = log min λ(Q)."""
    return np.tanh((np.asarray(log_b, float) - np.asarray(log_a, float)) / 4)


def log_q_extremes(
    instance: QuadraticInstance, alpha: float, gamma: float, theta: Theta
) -> tuple[float, float]:
    """(log b, log a) = (log max_i λ_max(Q_i), log min_i λ_min(Q_i)); needs γ < 1/(L+α)."""
    check_client_lr(gamma, instance.L, alpha)
    lq = log_q(gamma * (instance.eigenvalues + alpha), theta)
    return float(lq.max()), float(lq.min())


# ---------------------------------------------------------------- distance bounds (000)


def bound_lemma5(C: float, log_b: float, log_a: float, dim: int) -> float:
    """‖x*(α,γ,Θ) − x*‖ ≤ 8C(√b−√a)/(√b+√a); 2C(…) in one dimension (Lemma 12)."""
    return (2.0 if dim == 1 else 8.0) * C * float(delta_lemma5(log_b, log_a))


def bound_thm4(C: float, log_kappa0: float, log_kappa: float) -> float:
    """Theorem 4: ‖x*(α,γ,Θ) − x*‖ ≤ 8C·Δ₁₇ (Θ_{1:K}, or Θ_K with γ < 1/(KL+α))."""
    return 8.0 * C * float(delta_eq17(log_kappa, log_kappa0))


# ---------------------------------------------------------------- distance bounds (001, α = 0)


def heterogeneity(instance: QuadraticInstance) -> tuple[float, float]:
    """(σ_A, σ_c): σ_A² = E‖A_i − Ā‖² (spectral norm), σ_c² = E‖c_i − c̄‖² (Assumption 3)."""
    p = instance.p
    dA = instance.A - np.einsum("i,ijk->jk", p, instance.A)
    dc = instance.c - p @ instance.c
    sigma_A = np.sqrt(p @ np.linalg.norm(dA, ord=2, axis=(1, 2)) ** 2)
    sigma_c = np.sqrt(p @ np.sum(dc**2, axis=1))
    return float(sigma_A), float(sigma_c)


def chi(gamma: float, theta: Theta, L: float) -> float:
    """χ(γ,Θ) = Σ θ_k (1−γL)^{k−1} / Σ θ_k (eq. 21 of Charles & Konečný 2020)."""
    return float(np.exp(log_q(gamma * L, theta)) / theta.total_weight)


def bound_thm16(mu, L, sigma_A, sigma_c, gamma, theta: Theta) -> float:
    """Thm 16 (γ < 1/L): ‖x*(γ,Θ) − x*‖ ≤ (Lσ_c/μ)(1 + σ_A/μ)(1 − χ)/χ."""
    check_client_lr(gamma, L)
    x = chi(gamma, theta, L)
    return L * sigma_c / mu * (1 + sigma_A / mu) * (1 - x) / x


def bound_thm17(mu, L, sigma_A, sigma_c, gamma, K) -> float:
    """Thm 17 (γ < 1/L): ‖x*(γ,Θ_{1:K}) − x*‖ ≤ σ_c(1 + σ_A/μ)(KL − φ_{K,L}(γ))/φ_{K,μ}(γ)."""
    check_client_lr(gamma, L)
    return float(
        sigma_c * (1 + sigma_A / mu) * (K * L - phi(L, 0, gamma, K)) / phi(mu, 0, gamma, K)
    )


def bound_cor20(mu, L, sigma_A, sigma_c, eps, gamma, K) -> float:
    """Cor 20: if ε ≤ 1 − e^{−K} and γ ≤ ln(1/(1−ε))/(KL): bound σ_c(1+σ_A/μ)(L/μ)ε/(1−ε)."""
    if not 0 <= eps <= 1 - np.exp(-K):
        raise ConfigError("eps", f"must be in [0, 1 - e^-K] = [0, {1 - np.exp(-K):.6g}]")
    if gamma > np.log(1 / (1 - eps)) / (K * L):
        raise ConfigError("client_lr", "client_lr must be <= ln(1/(1-eps))/(K*L)")
    return sigma_c * (1 + sigma_A / mu) * (L / mu) * eps / (1 - eps)


def bound_thm21(mu, L, sigma_c, gamma1, gamma2, K) -> float:
    """Thm 21 (γ₁ ≤ γ₂ < 1/L): ‖x*(γ₁) − x*(γ₂)‖ ≤ σ_c(1 + φ_L(γ₂)/φ_μ(γ₂))(φ_L(γ₁) − φ_L(γ₂))/φ_μ(γ₁)."""
    if gamma1 > gamma2:
        raise ConfigError("client_lr", "need gamma1 <= gamma2")
    check_client_lr(gamma2, L)
    pl1, pl2 = phi(L, 0, gamma1, K), phi(L, 0, gamma2, K)
    pm1, pm2 = phi(mu, 0, gamma1, K), phi(mu, 0, gamma2, K)
    return float(sigma_c * (1 + pl2 / pm2) * (pl1 - pl2) / pm1)


def bound_cor22(mu, L, sigma_c, gamma1, gamma2) -> float:
    """Cor 22 (γ₁ ≤ γ₂ < 1/L): ‖x*(γ₁) − x*(γ₂)‖ ≤ 2σ_c (L³/μ²)(γ₂ − γ₁)."""
    if gamma1 > gamma2:
        raise ConfigError("client_lr", "need gamma1 <= gamma2")
    check_client_lr(gamma2, L)
    return 2 * sigma_c * L**3 / mu**2 * (gamma2 - gamma1)


def message_variance_bound(K: int, G: float, M: int, B: int) -> float:
    """Lemma 23 (Θ_{1:K}, any γ ≥ 0): E‖q_γ(x) − E q_γ(x)‖² ≤ K G²/(M B).

    As proved, the bound covers the mini-batch noise for fixed sampled clients: the noise of
    local step j reaches the message as (I − γA_i)^{K−j} ξ_j, a contraction for γ < 2/L.
    Client sampling on heterogeneous data adds E_i‖∇f̃_i − ∇f̃‖²/M, which G does not bound.
    """
    return K * G**2 / (M * B)
