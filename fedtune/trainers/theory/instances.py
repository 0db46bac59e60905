"""Quadratic federated instances with exactly known client Hessians A_i and minimisers c_i.

Client i's loss is f_i(x) = ½ (x − c_i)ᵀ A_i (x − c_i) (docs/explanation/algorithms.md §3.1;
Charles & Konečný 2021 (arXiv:2103.05032) §2, Charles & Konečný 2020 (arXiv:2007.00878) §3). The
global loss is f(x) = Σ_i p_i f_i(x) with minimiser x* = (Σ p_i A_i)⁻¹ Σ p_i A_i c_i, which in
general is *not* the mean of the c_i.

Generators (docs/explanation/algorithms.md §8 conventions, App. D.1 of Charles & Konečný 2021):
* :func:`spd_with_spectrum` — A = R diag(λ) Rᵀ with R random orthogonal and λ in [μ, L]
  (both ends attained);
* :func:`spd_affine_gaussian` — A = a·GᵀG + b·I, the affine map that gives λ_min = μ, λ_max = L;
* :func:`random_instance` — N clients, ‖c_i‖ ≤ C.
All randomness comes from an explicit ``numpy.random.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "QuadraticInstance",
    "random_instance",
    "spd_affine_gaussian",
    "spd_with_spectrum",
    "two_client_instance",
]


@dataclass(frozen=True)
class QuadraticInstance:
    """N quadratic clients: ``A`` [N, d, d] symmetric PD, ``c`` [N, d], weights ``p`` [N]."""

    A: np.ndarray
    c: np.ndarray
    p: np.ndarray

    def __post_init__(self) -> None:
        if self.A.ndim != 3 or self.A.shape[1] != self.A.shape[2]:
            raise ValueError("A must have shape [N, d, d]")
        if self.c.shape != self.A.shape[:2]:
            raise ValueError("c must have shape [N, d]")
        if self.p.shape != (self.A.shape[0],) or abs(float(self.p.sum()) - 1.0) > 1e-9:
            raise ValueError("p must be a probability vector of length N")

    @property
    def num_clients(self) -> int:
        return int(self.A.shape[0])

    @property
    def dim(self) -> int:
        return int(self.A.shape[1])

    @property
    def eigenvalues(self) -> np.ndarray:
        """[N, d] eigenvalues of every A_i, ascending."""
        return np.linalg.eigvalsh(self.A)

    @property
    def mu(self) -> float:
        return float(self.eigenvalues.min())

    @property
    def L(self) -> float:
        return float(self.eigenvalues.max())

    def x_star(self) -> np.ndarray:
        """Minimiser of f: (Σ p_i A_i)⁻¹ Σ p_i A_i c_i."""
        H = np.einsum("i,ijk->jk", self.p, self.A)
        b = np.einsum("i,ijk,ik->j", self.p, self.A, self.c)
        return np.linalg.solve(H, b)

    def client_losses(self, x: np.ndarray) -> np.ndarray:
        diff = x[None, :] - self.c
        return 0.5 * np.einsum("ij,ijk,ik->i", diff, self.A, diff)

    def loss(self, x: np.ndarray) -> float:
        return float(self.p @ self.client_losses(x))

    def client_gradients(self, x: np.ndarray) -> np.ndarray:
        return np.einsum("ijk,ik->ij", self.A, x[None, :] - self.c)


def spd_with_spectrum(dim: int, mu: float, L: float, rng: np.random.Generator) -> np.ndarray:
    """R diag(λ) Rᵀ with λ_1 = μ, λ_d = L and the rest uniform in [μ, L]."""
    if not 0 < mu <= L:
        raise ValueError("need 0 < mu <= L")
    if dim == 1:
        return np.array([[mu if mu == L else rng.uniform(mu, L)]])
    lam = np.concatenate([[mu, L], rng.uniform(mu, L, size=dim - 2)])
    q, r = np.linalg.qr(rng.standard_normal((dim, dim)))
    q = q * np.sign(np.diag(r))
    A = (q * lam) @ q.T
    return 0.5 * (A + A.T)


def spd_with_spectrum_batch(
    n: int, dim: int, mu: float, L: float, rng: np.random.Generator
) -> np.ndarray:
    """``n`` matrices [n, d, d], the same as ``n`` calls of :func:`spd_with_spectrum` on ``rng``
    (same draws in the same order, one batched QR and product instead of ``n``)."""
    if not 0 < mu <= L:
        raise ValueError("need 0 < mu <= L")
    if dim == 1:
        lam = np.full(n, mu) if mu == L else rng.uniform(mu, L, size=n)
        return lam.reshape(n, 1, 1).astype(np.float64)
    lam = np.empty((n, dim))
    lam[:, 0], lam[:, 1] = mu, L
    if dim == 2:  # no uniform draws in between: one normal draw for all
        g = rng.standard_normal((n, dim, dim))
    else:
        g = np.empty((n, dim, dim))
        for i in range(n):  # interleaved uniform and normal draws: a pair of calls per matrix
            lam[i, 2:] = rng.uniform(mu, L, size=dim - 2)
            g[i] = rng.standard_normal((dim, dim))
    q, r = np.linalg.qr(g)
    q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
    A = (q * lam[:, None, :]) @ q.transpose(0, 2, 1)
    return 0.5 * (A + A.transpose(0, 2, 1))


def spd_affine_gaussian(dim: int, mu: float, L: float, rng: np.random.Generator) -> np.ndarray:
    """A = a·GᵀG + b·I with λ_min(A) = μ, λ_max(A) = L (Charles & Konečný 2021 App. D.1)."""
    G = rng.standard_normal((dim, dim))
    s = np.linalg.eigvalsh(G.T @ G)
    a = (L - mu) / (s[-1] - s[0])
    b = mu - a * s[0]
    A = a * (G.T @ G) + b * np.eye(dim)
    return 0.5 * (A + A.T)


def random_instance(
    num_clients: int,
    dim: int,
    mu: float,
    L: float,
    rng: np.random.Generator,
    radius: float = 1.0,
    heterogeneity: float = 1.0,
    weights: np.ndarray | None = None,
) -> QuadraticInstance:
    """Clients with spectra in [μ, L] and minimisers c_i = c̄ + heterogeneity·u_i, ‖c_i‖ ≤ radius.

    ``heterogeneity`` = 0 gives identical minimisers (A_i still differ); 1 gives independent ones.
    """
    A = spd_with_spectrum_batch(num_clients, dim, mu, L, rng)
    center = rng.standard_normal(dim)
    spread = rng.standard_normal((num_clients, dim))
    c = (1.0 - heterogeneity) * center[None, :] + heterogeneity * spread
    norms = np.linalg.norm(c, axis=1, keepdims=True)
    c = c * (radius / max(float(norms.max()), 1e-12))
    p = np.full(num_clients, 1.0 / num_clients) if weights is None else np.asarray(weights, float)
    return QuadraticInstance(A=A, c=c, p=p / p.sum())


def two_client_instance() -> QuadraticInstance:
    """Charles & Konečný 2020 §4: A = (1, 2), c = (1, ½), uniform; x* = 2/3."""
    return QuadraticInstance(
        A=np.array([[[1.0]], [[2.0]]]), c=np.array([[1.0], [0.5]]), p=np.array([0.5, 0.5])
    )
