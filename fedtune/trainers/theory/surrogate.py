"""Exact surrogate losses of LocalUpdate on quadratics (docs/explanation/algorithms.md §3.2–3.6).

Client i with Hessian A_i and minimiser c_i sends, in expectation, ∇f̃_i(x) = Q_i A_i (x − c_i)
with the *distortion matrix* (Charles & Konečný 2021 (arXiv:2103.05032) Thm 1,
Charles & Konečný 2020 (arXiv:2007.00878) Thm 3)

    Q_i(α, γ, Θ) = Σ_k θ_k (I − γ(A_i + αI))^{k−1}.

Q_i is a polynomial in A_i, so each eigenvalue λ of A_i maps to the eigenvalue
q(λ) = Σ_k θ_k (1 − z)^{k−1}, z = γ(λ + α), of Q_i and ν(λ) = q(λ)·λ of Q_i A_i
(Charles & Konečný 2021 Lemma 9). Closed forms:

* Θ_{1:K}: φ(λ) = λ [1 − (1 − z)^K] / z   (Kλ at z = 0)
* Θ_K:     ψ(λ) = (1 − z)^{K−1} λ

computed in log space — (1 − z)^K = exp(K·log1p(−z)), 1 − (1 − z)^K = −expm1(K·log1p(−z)) — so
K up to 10⁶ neither under- nor overflows. Everything here is numpy float64 and pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from fedtune.errors import ConfigError

from .instances import QuadraticInstance

__all__ = [
    "SurrogateSpectrum",
    "Theta",
    "ThetaFamily",
    "check_client_lr",
    "check_problem",
    "distortion_matrices",
    "kappa_closed_form",
    "log_kappa_closed_form",
    "log_nu",
    "log_q",
    "nu",
    "phi",
    "psi",
    "q_eigen",
    "surrogate_gap",
    "surrogate_minimizer",
    "surrogate_spectrum",
    "theta_from_coeffs",
    "theta_last",
    "theta_maml",
    "theta_sum",
]


class ThetaFamily(StrEnum):
    SUM = "sum"  # Θ_{1:K} = (1, …, 1): FedAvg, Reptile, FedProx
    LAST = "last"  # Θ_K = (0, …, 0, 1): FOMAML; MAML is Θ_{2K+1}
    GENERAL = "general"  # any non-negative finite coefficient vector


@dataclass(frozen=True)
class Theta:
    """Θ = (θ_1, …, θ_K): ``family`` picks a closed form; ``weights`` only for ``general``."""

    family: ThetaFamily
    K: int
    weights: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "family", ThetaFamily(self.family))
        except ValueError as exc:
            raise ConfigError("theta", str(exc)) from None
        if int(self.K) != self.K or self.K < 1:
            raise ConfigError("local_steps", f"must be an integer >= 1, got {self.K!r}")
        if self.family is ThetaFamily.GENERAL and len(self.weights) != self.K:
            raise ConfigError("theta", "general theta needs exactly K weights")

    @property
    def coeffs(self) -> np.ndarray:
        """The dense coefficient vector (length K)."""
        if self.family is ThetaFamily.SUM:
            return np.ones(self.K)
        if self.family is ThetaFamily.LAST:
            out = np.zeros(self.K)
            out[-1] = 1.0
            return out
        return np.asarray(self.weights, dtype=float)

    @property
    def total_weight(self) -> float:
        """w(Θ) = Σ θ_k; the surrogate tends to w(Θ)·f as γ → 0."""
        return float(self.coeffs.sum())


def theta_sum(K: int) -> Theta:
    """Θ_{1:K}: the sum of all K local gradients (FedAvg / Reptile / FedProx)."""
    return Theta(ThetaFamily.SUM, int(K))


def theta_last(K: int) -> Theta:
    """Θ_K: only the K-th local gradient (FOMAML after K − 1 adaptation steps)."""
    return Theta(ThetaFamily.LAST, int(K))


def theta_maml(K: int) -> Theta:
    """K-step MAML with exact GD inner steps ≡ Θ_{2K+1} on quadratics
    (docs/explanation/algorithms.md §3.12)."""
    return theta_last(2 * int(K) + 1)


def theta_from_coeffs(coeffs) -> Theta:
    """Θ from a coefficient vector: non-negative, finite, not all zero; trailing zeros dropped.

    All-ones and one-hot-last vectors are recognised so their closed forms are used.
    """
    values = np.asarray(coeffs, dtype=float).ravel()
    if values.size == 0 or not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ConfigError("theta", "coefficients must be finite and non-negative")
    nz = np.flatnonzero(values)
    if nz.size == 0:
        raise ConfigError("theta", "needs at least one positive coefficient")
    values = values[: nz[-1] + 1]
    if np.all(values == 1.0):
        return theta_sum(values.size)
    if nz.size == 1 and values[-1] == 1.0:
        return theta_last(values.size)
    return Theta(ThetaFamily.GENERAL, values.size, tuple(float(v) for v in values))


def check_problem(mu: float, L: float, alpha: float = 0.0, gamma: float = 0.0) -> None:
    """Validate 0 < μ ≤ L, α ≥ 0, γ ≥ 0 (fields named as in docs/explanation/algorithms.md §0)."""
    if not (np.isfinite(mu) and mu > 0):
        raise ConfigError("mu", f"must be > 0, got {mu!r}")
    if not (np.isfinite(L) and mu <= L):
        raise ConfigError("L", f"must be >= mu = {mu!r}, got {L!r}")
    if not (np.all(np.isfinite(alpha)) and np.all(np.asarray(alpha) >= 0)):
        raise ConfigError("prox_alpha", f"must be >= 0, got {alpha!r}")
    if not (np.all(np.isfinite(gamma)) and np.all(np.asarray(gamma) >= 0)):
        raise ConfigError("client_lr", f"must be >= 0, got {gamma!r}")


def check_client_lr(gamma, L: float, alpha=0.0, K=None) -> None:
    """γ < 1/(L+α) (Lemma 1: every Q_i ≻ 0); with ``K``: γ < 1/(KL+α) (Θ_K closed forms)."""
    k = 1.0 if K is None else K
    g, a, k = (
        np.ravel(v) for v in np.broadcast_arrays(*(np.asarray(v, float) for v in (gamma, alpha, k)))
    )
    limit = 1.0 / (k * L + a)
    bad = np.flatnonzero(g >= limit)
    if bad.size == 0:
        return
    i = bad[0]
    if K is None:
        reason = f"client_lr must be < 1/(L+alpha) = {limit[i]:.6g}, got {g[i]:.6g}"
    else:
        reason = (
            f"client_lr must be < 1/(K*L+alpha) = {limit[i]:.6g} for the Theta_K closed form "
            f"(K={k[i]:g}), got {g[i]:.6g}"
        )
    raise ConfigError("client_lr", reason)


def _log1m(z):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log1p(-np.asarray(z, float))


def q_eigen(z, theta: Theta) -> np.ndarray:
    """q(z) = Σ_k θ_k (1 − z)^{k−1}, the eigenvalue of Q at z = γ(λ + α) (any real z)."""
    z = np.asarray(z, float)
    if theta.family is ThetaFamily.GENERAL:
        return np.polynomial.polynomial.polyval(1.0 - z, theta.coeffs)
    K = theta.K
    stable = z < 1.0
    zs = np.where(stable, z, 0.5)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if theta.family is ThetaFamily.SUM:
            value = np.where(zs > 0, -np.expm1(K * _log1m(zs)) / np.where(zs > 0, zs, 1.0), K)
            direct = np.where(z != 0, (1.0 - np.power(1.0 - z, K)) / np.where(z != 0, z, 1.0), K)
        else:
            value = np.exp((K - 1) * _log1m(zs))
            direct = np.power(1.0 - z, K - 1)
    return np.where(stable, value, direct)


def log_q(z, theta: Theta) -> np.ndarray:
    """log q(z) for 0 ≤ z < 1 (q > 0 there); Θ_K in pure log space: (K − 1)·log1p(−z)."""
    z = np.asarray(z, float)
    if theta.family is ThetaFamily.LAST:
        return (theta.K - 1) * _log1m(z) if theta.K > 1 else np.zeros_like(z)
    with np.errstate(divide="ignore"):
        return np.log(q_eigen(z, theta))


def phi(lam, alpha, gamma, K) -> np.ndarray:
    """φ(λ; α, γ, K) = λ[1 − (1 − γ(λ+α))^K]/(γ(λ+α)); real K allowed (log-space form)."""
    lam, z = np.asarray(lam, float), np.asarray(gamma, float) * (np.asarray(lam) + alpha)
    K = np.asarray(K, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(z > 0, -np.expm1(K * _log1m(z)) / np.where(z > 0, z, 1.0), K)
    return lam * ratio


def psi(lam, alpha, gamma, K) -> np.ndarray:
    """ψ(λ; α, γ, K) = (1 − γ(λ+α))^{K−1} λ (Θ_K); real K allowed."""
    z = np.asarray(gamma, float) * (np.asarray(lam, float) + alpha)
    return np.exp((np.asarray(K, float) - 1) * _log1m(z)) * lam


def nu(lam, alpha, gamma, theta: Theta) -> np.ndarray:
    """ν(λ) = q(γ(λ+α))·λ, the eigenvalue of Q_i A_i for the eigenvalue λ of A_i."""
    lam = np.asarray(lam, float)
    return q_eigen(gamma * (lam + alpha), theta) * lam


def log_nu(lam, alpha, gamma, theta: Theta) -> np.ndarray:
    lam = np.asarray(lam, float)
    return log_q(gamma * (lam + alpha), theta) + np.log(lam)


def distortion_matrices(A, alpha: float, gamma: float, theta: Theta, method: str = "eig"):
    """Q_i for A of shape [N, d, d] (or [d, d]).

    ``method="power"`` evaluates the defining sum by Horner's rule on matrices
    (Q = θ_1 I + M(θ_2 I + M(…)), M = I − γ(A + αI)); ``"eig"`` uses Q = V diag(q(z)) Vᵀ.
    """
    A = np.asarray(A, float)
    eye = np.eye(A.shape[-1])
    if method == "power":
        M = eye - gamma * (A + alpha * eye)
        coeffs = theta.coeffs
        Q = np.broadcast_to(coeffs[-1] * eye, A.shape).copy()
        for c in coeffs[-2::-1]:
            Q = Q @ M + c * eye
        return Q
    if method != "eig":
        raise ConfigError("method", f"must be 'eig' or 'power', got {method!r}")
    lam, V = np.linalg.eigh(A)
    return (V * q_eigen(gamma * (lam + alpha), theta)[..., None, :]) @ np.swapaxes(V, -1, -2)


def surrogate_minimizer(
    instance: QuadraticInstance, alpha: float, gamma: float, theta: Theta, strict: bool = True
) -> np.ndarray:
    """x*(α,γ,Θ) = (Σ p_i Q_i A_i)⁻¹ Σ p_i Q_i A_i c_i (Charles & Konečný 2021 Lemma 11).

    ``strict`` requires γ < 1/(L+α); otherwise any γ whose surrogate Hessian is positive
    definite is accepted (Charles & Konečný 2020 §4 explores that regime). A common
    factor exp(max log ν) is divided out so Θ_K with K ~ 10⁶ does not underflow.
    """
    check_problem(instance.mu, instance.L, alpha, gamma)
    lam, V = np.linalg.eigh(instance.A)
    z = gamma * (lam + alpha)
    if strict:
        check_client_lr(gamma, float(lam.max()), alpha)
    if np.all(z < 1.0):
        logw = log_nu(lam, alpha, gamma, theta) + np.log(instance.p)[:, None]
        w = np.exp(logw - logw.max())
    else:
        w = nu(lam, alpha, gamma, theta) * instance.p[:, None]
    H_i = (V * w[:, None, :]) @ np.swapaxes(V, -1, -2)
    H = H_i.sum(axis=0)
    if np.linalg.eigvalsh(H)[0] <= 0:
        raise ConfigError(
            "client_lr",
            f"surrogate Hessian E[Q_i A_i] is not positive definite at client_lr={gamma:g}",
        )
    b = np.einsum("ijk,ik->j", H_i, instance.c)
    return np.linalg.solve(H, b)


def surrogate_gap(
    instance: QuadraticInstance, alpha: float, gamma: float, theta: Theta, strict=True
):
    """‖x*(α,γ,Θ) − x*‖."""
    x = surrogate_minimizer(instance, alpha, gamma, theta, strict=strict)
    return float(np.linalg.norm(x - instance.x_star()))


@dataclass(frozen=True)
class SurrogateSpectrum:
    """L̃ = E_i λ_max(Q_iA_i), μ̃ = E_i λ_min(Q_iA_i) (in logs) and κ = L̃/μ̃ (eq. 9)."""

    log_L_tilde: float
    log_mu_tilde: float

    @property
    def L_tilde(self) -> float:
        return float(np.exp(self.log_L_tilde))

    @property
    def mu_tilde(self) -> float:
        return float(np.exp(self.log_mu_tilde))

    @property
    def log_kappa(self) -> float:
        return self.log_L_tilde - self.log_mu_tilde

    @property
    def kappa(self) -> float:
        return float(np.exp(self.log_kappa))


def surrogate_spectrum(
    instance: QuadraticInstance, alpha: float, gamma: float, theta: Theta, method: str = "eig"
) -> SurrogateSpectrum:
    """L̃, μ̃ from the explicit eigenvalues of Q_i A_i (requires γ < 1/(L+α)).

    ``"eig"`` evaluates ν at the eigenvalues of A_i in log space (valid for any K);
    ``"matrix"`` forms Q_i A_i (Horner) and calls ``eigvalsh`` — the definition, for moderate K.
    """
    check_problem(instance.mu, instance.L, alpha, gamma)
    check_client_lr(gamma, instance.L, alpha)
    logp = np.log(instance.p)
    if method == "matrix":
        Q = distortion_matrices(instance.A, alpha, gamma, theta, method="power")
        ev = np.linalg.eigvalsh(Q @ instance.A)
        return SurrogateSpectrum(
            float(np.log(instance.p @ ev[:, -1])), float(np.log(instance.p @ ev[:, 0]))
        )
    ln = log_nu(instance.eigenvalues, alpha, gamma, theta)
    return SurrogateSpectrum(
        float(np.logaddexp.reduce(logp + ln.max(axis=1))),
        float(np.logaddexp.reduce(logp + ln.min(axis=1))),
    )


def log_kappa_closed_form(mu, L, alpha, gamma, family, K) -> np.ndarray:
    """log κ on the spectrum [μ, L] (Charles & Konečný 2021 Lemmas 3–4), vectorised.

    Θ_{1:K}: log φ(L) − log φ(μ), needs γ < 1/(L+α).
    Θ_K:     (K−1)[log1p(−γ(L+α)) − log1p(−γ(μ+α))] + log(L/μ), needs γ < 1/(KL+α).
    """
    family = ThetaFamily(family)
    check_problem(mu, L, alpha, gamma)
    if np.any(np.asarray(K) < 1):
        raise ConfigError("local_steps", "must be >= 1")
    check_client_lr(gamma, L, alpha)
    if family is ThetaFamily.SUM:
        return np.log(phi(L, alpha, gamma, K)) - np.log(phi(mu, alpha, gamma, K))
    if family is ThetaFamily.LAST:
        check_client_lr(gamma, L, alpha, K=K)
        K = np.asarray(K, float)
        g = np.asarray(gamma, float)
        return (K - 1) * (_log1m(g * (L + alpha)) - _log1m(g * (mu + alpha))) + np.log(L / mu)
    raise ConfigError("theta", "closed-form kappa exists only for the 'sum' and 'last' families")


def kappa_closed_form(mu, L, alpha, gamma, family, K) -> np.ndarray:
    """κ = exp(:func:`log_kappa_closed_form`): φ(L)/φ(μ) for Θ_{1:K}, ψ(L)/ψ(μ) for Θ_K."""
    return np.exp(log_kappa_closed_form(mu, L, alpha, gamma, family, K))
