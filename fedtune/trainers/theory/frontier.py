"""(ρ, Δ) Pareto frontiers of local-update methods (docs/explanation/algorithms.md §3.11).

Analytic regime (Charles & Konečný 2021 (arXiv:2103.05032) §5): for each swept setting compute κ
from the closed forms (φ-ratio for Θ_{1:K}, ψ-ratio for Θ_K), then ρ(κ) (Table 2) and
Δ = tanh(¼ ln(κ₀/κ)) (eq. 17). Because ρ and Δ are monotone in κ alone, every method traces a
sub-arc of one universal curve per (ServerOpt, κ₀).

Simulated regime (Charles & Konečný 2021 §5, App. D.1), needed for Θ_K with
γ ≥ 1/(KL+α): one client with a random A = a·GᵀG + b·I (spectrum ends exactly μ and L),
κ = max_j ν(λ_j)/min_j ν(λ_j) in log space, and Δ from Lemma 5, Δ = tanh(¼ ln(b/a)) with
b, a the extreme eigenvalues of Q (the docs/explanation/algorithms.md §3.11 recommendation; eq. 17
would give Δ < 0 once κ > κ₀).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from fedtune.errors import ConfigError

from .instances import spd_affine_gaussian
from .rates import ServerOpt, delta_eq17, delta_lemma5, rate_from_log_kappa
from .surrogate import (
    Theta,
    ThetaFamily,
    check_client_lr,
    check_problem,
    log_kappa_closed_form,
    log_q,
)

__all__ = [
    "Frontier",
    "FrontierSpec",
    "GammaRule",
    "Sweep",
    "frontier",
    "frontier_from_spec",
    "log_int_grid",
    "maml_cusp",
    "resolve_gamma",
    "simulated_log_kappa",
    "universal_delta",
]


class Sweep(StrEnum):
    K = "K"
    GAMMA = "gamma"
    ALPHA = "alpha"


class GammaRule(StrEnum):
    """Client learning rates that depend on the swept parameter (figure captions)."""

    HALF_L = "half-L"  # γ = ½ (L + α)⁻¹   (Figs 2, 3)
    HALF_KL = "half-KL"  # γ = (2LK)⁻¹        (Fig 4, Θ_K)


def resolve_gamma(gamma, K, alpha, L: float) -> np.ndarray:
    """γ per point from a number or a :class:`GammaRule`."""
    K, alpha = np.asarray(K, float), np.asarray(alpha, float)
    if isinstance(gamma, str):
        try:
            rule = GammaRule(gamma)
        except ValueError:
            raise ConfigError(
                "client_lr", f"must be a number or one of {[r.value for r in GammaRule]}"
            ) from None
        if rule is GammaRule.HALF_L:
            return np.broadcast_to(0.5 / (L + alpha), np.broadcast(K, alpha).shape).astype(float)
        return np.broadcast_to(0.5 / (L * K), np.broadcast(K, alpha).shape).astype(float)
    return np.broadcast_to(np.asarray(gamma, float), np.broadcast(K, alpha).shape).astype(float)


def log_int_grid(lo: int, hi: int, n: int) -> np.ndarray:
    """Unique integers, log-spaced from ``lo`` to ``hi`` (both included)."""
    if not 1 <= lo <= hi or n < 1:
        raise ConfigError("K_range", f"need 1 <= lo <= hi and n >= 1, got {lo}, {hi}, {n}")
    return np.unique(np.round(np.geomspace(lo, hi, n)).astype(np.int64))


def maml_cusp(mu: float, L: float, alpha: float, gamma: float) -> float:
    """K_c = 1 + ln(L/μ)/ln((1 − γ(μ+α))/(1 − γ(L+α))): ψ(μ) = ψ(L) (§3.11 [DERIVED])."""
    check_problem(mu, L, alpha, gamma)
    check_client_lr(gamma, L, alpha)
    return 1.0 + np.log(L / mu) / (np.log1p(-gamma * (mu + alpha)) - np.log1p(-gamma * (L + alpha)))


def simulated_log_kappa(eigs, alpha, gamma, theta_family, K) -> tuple[np.ndarray, np.ndarray]:
    """(log κ, log b/a) for one client with eigenvalues ``eigs`` [d] at each (γ, K, α) point."""
    eigs = np.asarray(eigs, float)
    g, a, k = np.broadcast_arrays(*(np.asarray(v, float) for v in (gamma, alpha, K)))
    g, a, k = g.ravel(), a.ravel(), k.ravel()
    lq = np.stack(
        [
            log_q(gi * (eigs + ai), Theta(ThetaFamily(theta_family), int(ki)))
            for gi, ai, ki in zip(g, a, k, strict=True)
        ]
    )
    lnu = lq + np.log(eigs)
    return lnu.max(axis=1) - lnu.min(axis=1), lq.max(axis=1) - lq.min(axis=1)


def universal_delta(rho, log_kappa0: float, server_opt: ServerOpt | str) -> np.ndarray:
    """Δ₁₇ on the universal analytic curve at rate ρ (inverse of ρ(κ), then eq. 17)."""
    rho = np.asarray(rho, float)
    opt = ServerOpt(server_opt)
    with np.errstate(divide="ignore"):
        return delta_eq17(_log_kappa_from_rate(rho, opt), log_kappa0)


def _log_kappa_from_rate(rho: np.ndarray, opt: ServerOpt) -> np.ndarray:
    if opt is ServerOpt.GD:
        ell = 2 * np.arctanh(rho)
    elif opt is ServerOpt.HEAVY_BALL:
        ell = 4 * np.arctanh(rho)
    else:  # ρ = 1 − 2/√(3κ+1)  ⇒  κ = ((2/(1−ρ))² − 1)/3
        ell = np.log(((2 / (1 - rho)) ** 2 - 1) / 3)
    return ell


@dataclass(frozen=True)
class FrontierSpec:
    """One frontier curve: everything :func:`frontier` needs (serialisable)."""

    mu: float
    L: float
    alpha: float
    theta_family: ThetaFamily
    sweep: Sweep
    values: tuple[float, ...]
    gamma: float | GammaRule | None = None
    K: int | None = None
    server_opt: ServerOpt = ServerOpt.GD
    simulated: bool = False
    dim: int = 100
    seed: int = 0
    drop_invalid: bool = False

    def __post_init__(self) -> None:
        try:
            for name, kind in (
                ("theta_family", ThetaFamily),
                ("sweep", Sweep),
                ("server_opt", ServerOpt),
            ):
                object.__setattr__(self, name, kind(getattr(self, name)))
        except ValueError as exc:
            raise ConfigError("frontier", str(exc)) from None
        if self.theta_family is ThetaFamily.GENERAL:
            raise ConfigError("theta", "frontiers are defined for the 'sum' and 'last' families")
        check_problem(self.mu, self.L, self.alpha)
        if not self.values:
            raise ConfigError("values", "needs at least one swept value")
        if self.sweep is not Sweep.K and self.K is None:
            raise ConfigError("K", f"a fixed K is needed when sweeping {self.sweep.value}")
        if self.sweep is not Sweep.GAMMA and self.gamma is None:
            raise ConfigError("client_lr", "a client_lr (number or rule) is needed")
        if self.simulated and self.dim < 2:
            raise ConfigError("dim", "simulated frontiers need dim >= 2")


@dataclass(frozen=True)
class Frontier:
    """Points of one curve: swept value, γ, α, K, log κ, κ, ρ, Δ (arrays of equal length)."""

    spec: FrontierSpec
    param: np.ndarray
    gamma: np.ndarray
    alpha: np.ndarray
    K: np.ndarray
    log_kappa: np.ndarray
    rho: np.ndarray
    delta: np.ndarray
    label: str = field(default="")

    @property
    def kappa(self) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.exp(self.log_kappa)

    def points(self) -> np.ndarray:
        """[n, 4] array of (param, κ, ρ, Δ)."""
        return np.column_stack([self.param, self.kappa, self.rho, self.delta])

    def rows(self) -> list[dict]:
        keys = ("param", "gamma", "alpha", "K", "kappa", "log_kappa", "rho", "delta")
        cols = [
            self.param,
            self.gamma,
            self.alpha,
            self.K,
            self.kappa,
            self.log_kappa,
            self.rho,
            self.delta,
        ]
        return [
            {k: (float(v) if np.isfinite(v) else None) for k, v in zip(keys, vals, strict=True)}
            for vals in zip(*cols, strict=True)
        ]


def _grid(spec: FrontierSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    values = np.asarray(spec.values, float)
    K = values if spec.sweep is Sweep.K else np.full(values.shape, float(spec.K))
    alpha = values if spec.sweep is Sweep.ALPHA else np.full(values.shape, float(spec.alpha))
    if spec.sweep is Sweep.K and np.any((K < 1) | (np.round(K) != K)):
        raise ConfigError("values", "K values must be integers >= 1")
    if spec.sweep is Sweep.GAMMA:
        gamma = values.copy()
    else:
        gamma = resolve_gamma(spec.gamma, K, alpha, spec.L)
    check_problem(spec.mu, spec.L, alpha, gamma)
    return values, K, alpha, gamma


def _valid(spec: FrontierSpec, K, alpha, gamma) -> np.ndarray:
    ok = gamma < 1.0 / (spec.L + alpha)
    if spec.theta_family is ThetaFamily.LAST and not spec.simulated:
        ok &= gamma < 1.0 / (K * spec.L + alpha)
    return ok


def frontier_from_spec(spec: FrontierSpec, label: str = "") -> Frontier:
    values, K, alpha, gamma = _grid(spec)
    ok = _valid(spec, K, alpha, gamma)
    if spec.drop_invalid:
        values, K, alpha, gamma = values[ok], K[ok], alpha[ok], gamma[ok]
    if values.size and spec.simulated:
        check_client_lr(gamma, spec.L, alpha)
        rng = np.random.default_rng(spec.seed)
        eigs = np.linalg.eigvalsh(spd_affine_gaussian(spec.dim, spec.mu, spec.L, rng))
        log_kappa, log_ba = simulated_log_kappa(eigs, alpha, gamma, spec.theta_family, K)
        delta = delta_lemma5(log_ba, 0.0)
    elif values.size:
        log_kappa = log_kappa_closed_form(spec.mu, spec.L, alpha, gamma, spec.theta_family, K)
        delta = delta_eq17(log_kappa, np.log(spec.L / spec.mu))
    else:
        log_kappa = delta = np.zeros(0)
    rho = rate_from_log_kappa(log_kappa, spec.server_opt)
    return Frontier(spec, values, gamma, alpha, K, np.asarray(log_kappa, float), rho, delta, label)


def frontier(
    mu: float,
    L: float,
    alpha: float,
    theta_family: ThetaFamily | str,
    sweep: Sweep | str,
    values: Sequence[float],
    gamma: float | str | None = None,
    K: int | None = None,
    server_opt: ServerOpt | str = ServerOpt.GD,
    simulated: bool = False,
    dim: int = 100,
    seed: int = 0,
    drop_invalid: bool = False,
    label: str = "",
) -> Frontier:
    """One (ρ, Δ) curve; see the module docstring. Invalid settings raise ``ConfigError``.

    ``gamma`` is a number or a :class:`GammaRule` (``"half-L"``, ``"half-KL"``); it is ignored
    when sweeping γ. ``K`` is the fixed number of local steps when sweeping γ or α.
    ``drop_invalid`` skips points violating γ < 1/(L+α) (or γ < 1/(KL+α) for analytic Θ_K)
    instead of raising — Fig. 9 of Charles & Konečný 2021 keeps only valid points.
    """
    g = gamma if gamma is None or isinstance(gamma, str) else float(gamma)
    spec = FrontierSpec(
        mu=float(mu),
        L=float(L),
        alpha=float(alpha),
        theta_family=theta_family,
        sweep=sweep,
        values=tuple(float(v) for v in values),
        gamma=g,
        K=None if K is None else int(K),
        server_opt=server_opt,
        simulated=bool(simulated),
        dim=int(dim),
        seed=int(seed),
        drop_invalid=bool(drop_invalid),
    )
    return frontier_from_spec(spec, label)
