"""The per-client loops the vectorized task builders replaced (the code before vectorization),
kept as the reference: ``tests/unit/test_vectorized_builders.py`` checks the builders give the
same data bit for bit, ``benchmarks/first_round.py`` times both side by side."""

from __future__ import annotations

import numpy as np
import torch

from fedtune.trainers.tasks import FederatedData
from fedtune.trainers.tasks.synthetic import SyntheticParams, _client_sizes
from fedtune.trainers.theory.instances import spd_with_spectrum

__all__ = ["linreg_loop", "quadratic_loop", "rows_loop", "synthetic_loop", "synthetic_task_loop"]


def rows_loop(rng, A, c, n, noise) -> torch.Tensor:
    d = c.shape[0]
    xi = rng.standard_normal((n, d)) * (noise / np.sqrt(d))
    xi = xi - xi.mean(0, keepdims=True) if n > 1 else np.zeros_like(xi)
    rows = np.concatenate(
        [np.broadcast_to(A.reshape(1, -1), (n, d * d)), np.broadcast_to(c, (n, d)), xi], axis=1
    )
    return torch.from_numpy(rows.copy())


def quadratic_loop(params: dict, seed: int) -> FederatedData:
    """The ``quadratic`` task's training data (defaults as QuadraticParams)."""
    p = {"dim": 10, "mu": 1.0, "L": 10.0, "radius": 1.0, "heterogeneity": 1.0, "examples": 40}
    p |= {"noise": 0.0, "examples_max": None, **params}
    clients, dim, examples = p["clients"], p["dim"], p["examples"]
    rng = np.random.default_rng([0x9A, seed])
    A = np.stack([spd_with_spectrum(dim, p["mu"], p["L"], rng) for _ in range(clients)])
    center = rng.standard_normal(dim)
    spread = rng.standard_normal((clients, dim))
    h = p["heterogeneity"]
    c = (1.0 - h) * center[None, :] + h * spread
    c = c * (p["radius"] / max(float(np.linalg.norm(c, axis=1).max()), 1e-12))
    sizes = [examples] * clients
    if p["examples_max"] is not None:
        size_rng = np.random.default_rng([0x9B, seed])
        sizes = size_rng.integers(examples, p["examples_max"] + 1, size=clients).tolist()
    return FederatedData.from_clients(
        [
            (rows_loop(rng, A[i], c[i], int(n), p["noise"]), torch.zeros(int(n)))
            for i, n in enumerate(sizes)
        ]
    )


def synthetic_loop(p: SyntheticParams, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    sizes = _client_sizes(p, rng)
    u = rng.normal(0.0, p.alpha, p.clients)
    b_mean = rng.normal(0.0, p.beta, p.clients)
    sd = np.arange(1, p.dim + 1, dtype=np.float64) ** -0.6
    if p.iid:
        w_shared = rng.normal(0.0, 1.0, (p.dim, p.classes))
        b_shared = rng.normal(0.0, 1.0, p.classes)
    out = []
    for k in range(p.clients):
        if p.iid:
            w, b, v = w_shared, b_shared, np.zeros(p.dim)
        else:
            w = rng.normal(u[k], 1.0, (p.dim, p.classes))
            b = rng.normal(u[k], 1.0, p.classes)
            v = rng.normal(b_mean[k], 1.0, p.dim)
        x = v + sd * rng.standard_normal((int(sizes[k]), p.dim))
        out.append((x, np.argmax(x @ w + b, axis=1).astype(np.int64)))
    return out


def synthetic_task_loop(params: dict, seed: int):
    """(train store, test inputs, test targets) of the ``synthetic`` task."""
    p = SyntheticParams(**params)
    train, test_x, test_y = [], [], []
    for x, y in synthetic_loop(p, seed):
        x, y = torch.from_numpy(x).to(torch.float32), torch.from_numpy(y)
        cut = len(x) - min(int(p.test_fraction * len(x)), len(x) - 1)
        train.append((x[:cut], y[:cut]))
        test_x.append(x[cut:])
        test_y.append(y[cut:])
    ids = [f"client_{k:04d}" for k in range(p.clients)]
    return FederatedData.from_clients(train, ids), torch.cat(test_x), torch.cat(test_y)


def linreg_loop(params: dict, seed: int) -> FederatedData:
    p = {"dim": 20, "examples": 50, "var_min": 1.0, "var_max": 10.0, **params}
    rng = np.random.default_rng([0x4E, seed])
    w_star = rng.standard_normal(p["dim"]) / np.sqrt(p["dim"])
    sd = np.sqrt(np.linspace(p["var_min"], p["var_max"], p["dim"]))
    clients = []
    for _ in range(p["clients"]):
        x = rng.standard_normal((p["examples"], p["dim"])) * sd
        clients.append((torch.from_numpy(x), torch.from_numpy(x @ w_star)))
    return FederatedData.from_clients(clients)
