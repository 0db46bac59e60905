"""Float64 reference simulation of LocalUpdate on quadratic clients
(docs/explanation/algorithms.md §1.3, §3).

One round, for every Monte-Carlo run r at once (arrays carry a leading run axis):

    clients:  y_1 = x;  g_k = A_i(y_k − c_i) + α(y_k − x) + ξ_k;  y_{k+1} = y_k − γ g_k
              q_i = Σ_k θ_k g_k                 ξ_k ~ N(0, G²/(dB) I): batch-B mean of per-example
                                                 noise with E‖ξ‖² = G² (Assumption 4, `001` §5)
    average:  q = Σ_i p_i q_i (full participation) or the mean over M sampled clients
    server:   gd          x ← x − η q(x)
              heavy_ball  x ← x − η q(x) + β(x − x_prev)
              nesterov    theory form: y = x + β(x − x_prev); x ← y − η q(y)
                          keras form:  m ← βm + q(x); x ← x − η(q + βm)

Sampling: M clients without replacement within a round for uniform p (with replacement by p
otherwise). Schedules give (γ_t, η_t) per round; :class:`Thm29Schedule` is Theorem 29 of
Charles & Konečný 2020 (arXiv:2007.00878), :class:`Thm27Schedule` its fixed-γ Theorem 27. The source
papers are Charles & Konečný 2021 (arXiv:2103.05032) and Charles & Konečný 2020.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from fedtune.errors import ConfigError

from .instances import QuadraticInstance
from .rates import ServerOpt
from .surrogate import Theta, phi

__all__ = [
    "ContinuumExample",
    "InstancePool",
    "LocalUpdateConfig",
    "NesterovForm",
    "SimulationResult",
    "Thm27Schedule",
    "Thm29Schedule",
    "client_messages",
    "simulate",
]


class NesterovForm(StrEnum):
    THEORY = "theory"
    KERAS = "keras"


class Schedule(Protocol):
    def rates(self, t: int) -> tuple[float, float]:
        """(client_lr γ_t, server_lr η_t) for round t = 1, 2, …"""


@dataclass(frozen=True)
class Thm29Schedule:
    """γ_t = min{1/(L(b+t)), ln 2/(Kμ)}, η_t = (3/μ_{γ_t})/(b+t), b = 3κ², μ_γ = φ_{K,μ}(γ)."""

    mu: float
    L: float
    local_steps: int

    @property
    def b(self) -> float:
        return 3.0 * (self.L / self.mu) ** 2

    def rates(self, t: int) -> tuple[float, float]:
        gamma = min(1.0 / (self.L * (self.b + t)), np.log(2.0) / (self.local_steps * self.mu))
        mu_gamma = float(phi(self.mu, 0.0, gamma, self.local_steps))
        return gamma, 3.0 / mu_gamma / (self.b + t)


@dataclass(frozen=True)
class Thm27Schedule:
    """Fixed γ, η_t = a_γ/(b_γ + t), a_γ = 2/μ_γ, b_γ = 2L_γ²/μ_γ² (Θ_{1:K})."""

    mu: float
    L: float
    local_steps: int
    client_lr: float

    def rates(self, t: int) -> tuple[float, float]:
        mu_g = float(phi(self.mu, 0.0, self.client_lr, self.local_steps))
        L_g = float(phi(self.L, 0.0, self.client_lr, self.local_steps))
        return self.client_lr, (2.0 / mu_g) / (2.0 * L_g**2 / mu_g**2 + t)


@dataclass(frozen=True)
class LocalUpdateConfig:
    """LocalUpdate hyper-parameters (docs/explanation/algorithms.md §0 names); ``schedule``
    overrides the rates."""

    theta: Theta
    client_lr: float
    server_lr: float
    prox_alpha: float = 0.0
    server_opt: ServerOpt = ServerOpt.GD
    server_momentum: float = 0.0
    nesterov_form: NesterovForm = NesterovForm.THEORY
    clients_per_round: int | None = None
    batch_size: int = 1
    grad_noise: float = 0.0
    schedule: Schedule | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "server_opt", ServerOpt(self.server_opt))
            object.__setattr__(self, "nesterov_form", NesterovForm(self.nesterov_form))
        except ValueError as exc:
            raise ConfigError("server_opt", str(exc)) from None
        for name in ("client_lr", "prox_alpha", "grad_noise", "server_momentum"):
            if getattr(self, name) < 0:
                raise ConfigError(name, "must be >= 0")
        if self.server_lr <= 0:
            raise ConfigError("server_lr", "must be > 0")
        if self.batch_size < 1:
            raise ConfigError("batch_size", "must be >= 1")
        if self.clients_per_round is not None and self.clients_per_round < 1:
            raise ConfigError("clients_per_round", "must be >= 1")


class ClientPool(Protocol):
    dim: int

    def full(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def sample(self, rng: np.random.Generator, runs: int, m: int): ...


@dataclass(frozen=True)
class InstancePool:
    """The clients of a :class:`QuadraticInstance`."""

    instance: QuadraticInstance

    @property
    def dim(self) -> int:
        return self.instance.dim

    def full(self):
        return self.instance.A, self.instance.c, self.instance.p

    def sample(self, rng: np.random.Generator, runs: int, m: int):
        inst, n = self.instance, self.instance.num_clients
        if np.allclose(inst.p, 1.0 / n):
            if m > n:
                raise ConfigError("clients_per_round", f"must be <= {n} clients")
            idx = np.argsort(rng.random((runs, n)), axis=1)[:, :m]
        else:
            idx = rng.choice(n, size=(runs, m), p=inst.p)
        return inst.A[idx], inst.c[idx]


@dataclass(frozen=True)
class ContinuumExample:
    """Charles & Konečný 2020 §4: f_i(x) = ½ i x² − x (A_i = i, c_i = 1/i), i ~ 8i/15 on [½, 2]."""

    dim: int = 1

    def full(self):
        raise ConfigError("clients_per_round", "a continuum of clients needs clients_per_round")

    def sample(self, rng: np.random.Generator, runs: int, m: int):
        i = np.sqrt(0.25 + 3.75 * rng.random((runs, m)))  # inverse CDF of 8i/15
        return i[..., None, None], (1.0 / i)[..., None]

    @staticmethod
    def x_star() -> float:
        return 1.0 / 1.4  # 1/E[i]

    @staticmethod
    def surrogate_minimizer(gamma: float, K: int) -> float:
        """E[φ(i)/i]/E[φ(i)] by quadrature, φ(i) = (1 − (1 − γi)^K)/γ (Ki at γ = 0)."""
        from scipy import integrate  # here: importing the theory (a task does) needs no SciPy

        def weight(i: float) -> float:  # eigenvalue of Q_i A_i, times the density 8i/15
            return float(phi(i, 0.0, gamma, K)) * 8 * i / 15

        num = integrate.quad(lambda i: weight(i) / i, 0.5, 2.0, limit=200)[0]
        den = integrate.quad(weight, 0.5, 2.0, limit=200)[0]
        return num / den


def client_messages(A, c, x, alpha, gamma, coeffs, noise_std, rng) -> np.ndarray:
    """q_i = Σ_k θ_k g_k for clients A [..., m, d, d], c [..., m, d] broadcast from x [..., d]."""
    x_b = x[..., None, :]
    y = np.broadcast_to(x_b, np.broadcast_shapes(x_b.shape, c.shape)).copy()
    msg = np.zeros_like(y)
    last = len(coeffs) - 1
    for k, theta_k in enumerate(coeffs):
        g = (A @ (y - c)[..., None])[..., 0]
        if alpha:
            g += alpha * (y - x_b)
        if noise_std:
            g += noise_std * rng.standard_normal(g.shape)
        if theta_k:
            msg += theta_k * g
        if k < last:
            y -= gamma * g
    return msg


@dataclass(frozen=True)
class SimulationResult:
    """Recorded iterates [n_rec, R, d] at ``recorded_rounds``; tail mean/var over t ≥ average_from."""

    recorded_rounds: np.ndarray
    iterates: np.ndarray
    final: np.ndarray
    tail_mean: np.ndarray | None
    tail_var: np.ndarray | None


def simulate(
    clients: QuadraticInstance | ClientPool,
    config: LocalUpdateConfig,
    x0,
    rounds: int,
    rng: np.random.Generator | None = None,
    runs: int = 1,
    record_every: int = 0,
    average_from: int | None = None,
) -> SimulationResult:
    """Run ``rounds`` rounds of LocalUpdate for ``runs`` independent runs from ``x0``.

    ``record_every`` = k > 0 stores x_t for t = 0, k, 2k, …; ``average_from`` accumulates the
    per-run mean and variance of x_t over t ∈ [average_from, rounds].
    """
    pool = InstancePool(clients) if isinstance(clients, QuadraticInstance) else clients
    stochastic = config.clients_per_round is not None or config.grad_noise > 0
    if stochastic and rng is None:
        raise ConfigError("rng", "a numpy Generator is needed for stochastic simulation")
    coeffs = config.theta.coeffs
    noise_std = config.grad_noise / np.sqrt(pool.dim * config.batch_size)
    full = None if config.clients_per_round is not None else pool.full()
    beta, opt = config.server_momentum, config.server_opt

    def message(point: np.ndarray, gamma: float) -> np.ndarray:
        if full is not None:
            A, c, p = full
            return np.einsum(
                "i,rid->rd",
                p,
                client_messages(A, c, point, config.prox_alpha, gamma, coeffs, noise_std, rng),
            )
        A, c = pool.sample(rng, runs, config.clients_per_round)
        msgs = client_messages(A, c, point, config.prox_alpha, gamma, coeffs, noise_std, rng)
        return msgs.mean(axis=1)

    x = np.broadcast_to(np.asarray(x0, float), (runs, pool.dim)).copy()
    x_prev, m = x.copy(), np.zeros_like(x)
    recs, rec_t = [x.copy()] if record_every else [], [0] if record_every else []
    s1 = s2 = None
    n_avg = 0
    for t in range(1, rounds + 1):
        gamma, eta = (
            config.schedule.rates(t) if config.schedule else (config.client_lr, config.server_lr)
        )
        if opt is ServerOpt.NESTEROV and config.nesterov_form is NesterovForm.THEORY:
            y = x + beta * (x - x_prev)
            x_prev, x = x, y - eta * message(y, gamma)
        elif opt is ServerOpt.NESTEROV:
            q = message(x, gamma)
            m = beta * m + q
            x = x - eta * (q + beta * m)
        elif opt is ServerOpt.HEAVY_BALL:
            x_prev, x = x, x - eta * message(x, gamma) + beta * (x - x_prev)
        else:
            x = x - eta * message(x, gamma)
        if record_every and t % record_every == 0:
            recs.append(x.copy())
            rec_t.append(t)
        if average_from is not None and t >= average_from:
            s1 = x.copy() if s1 is None else s1 + x
            s2 = x**2 if s2 is None else s2 + x**2
            n_avg += 1
    tail_mean = None if s1 is None else s1 / n_avg
    tail_var = None if s2 is None else s2 / n_avg - tail_mean**2
    iterates = np.stack(recs) if recs else np.zeros((0, runs, pool.dim))
    return SimulationResult(np.asarray(rec_t), iterates, x, tail_mean, tail_var)
