"""The vectorized task builders produce the data of the per-client loops they replaced, bit for
bit (same seed, same draws in the same order): the loops are kept here as the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedtune.trainers import build_task
from fedtune.trainers.tasks import FederatedData
from fedtune.trainers.tasks.synthetic import SyntheticParams, _client_sizes
from fedtune.trainers.theory.instances import spd_with_spectrum, spd_with_spectrum_batch


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _same_train(got: FederatedData, want: FederatedData) -> bool:
    return (
        _same(got.inputs, want.inputs)
        and _same(got.targets, want.targets)
        and _same(got.counts, want.counts)
        and _same(got.offsets, want.offsets)
        and tuple(got.client_ids) == tuple(want.client_ids)
    )


# ----------------------------------------------------------------- the loops (reference)


def _rows_loop(rng, A, c, n, noise):
    d = c.shape[0]
    xi = rng.standard_normal((n, d)) * (noise / np.sqrt(d))
    xi = xi - xi.mean(0, keepdims=True) if n > 1 else np.zeros_like(xi)
    rows = np.concatenate(
        [np.broadcast_to(A.reshape(1, -1), (n, d * d)), np.broadcast_to(c, (n, d)), xi], axis=1
    )
    return torch.from_numpy(rows.copy())


def _quadratic_loop(p: dict, seed: int) -> FederatedData:
    clients, dim, examples = p["clients"], p["dim"], p["examples"]
    rng = np.random.default_rng([0x9A, seed])
    A = np.stack([spd_with_spectrum(dim, p["mu"], p["L"], rng) for _ in range(clients)])
    center = rng.standard_normal(dim)
    spread = rng.standard_normal((clients, dim))
    h = p["heterogeneity"]
    c = (1.0 - h) * center[None, :] + h * spread
    c = c * (1.0 / max(float(np.linalg.norm(c, axis=1).max()), 1e-12))
    sizes = [examples] * clients
    if p.get("examples_max") is not None:
        size_rng = np.random.default_rng([0x9B, seed])
        sizes = size_rng.integers(examples, p["examples_max"] + 1, size=clients).tolist()
    return FederatedData.from_clients(
        [
            (_rows_loop(rng, A[i], c[i], int(n), p["noise"]), torch.zeros(int(n)))
            for i, n in enumerate(sizes)
        ]
    )


def _synthetic_loop(p: SyntheticParams, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
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


def _synthetic_task_loop(params: dict, seed: int):
    p = SyntheticParams(**params)
    train, test_x, test_y = [], [], []
    for x, y in _synthetic_loop(p, seed):
        x, y = torch.from_numpy(x).to(torch.float32), torch.from_numpy(y)
        cut = len(x) - min(int(p.test_fraction * len(x)), len(x) - 1)
        train.append((x[:cut], y[:cut]))
        test_x.append(x[cut:])
        test_y.append(y[cut:])
    ids = [f"client_{k:04d}" for k in range(p.clients)]
    return FederatedData.from_clients(train, ids), torch.cat(test_x), torch.cat(test_y)


# ----------------------------------------------------------------- the comparisons


@pytest.mark.parametrize("dim", [1, 2, 3, 7])
@pytest.mark.parametrize(("mu", "L"), [(1.0, 10.0), (2.0, 2.0)])
def test_batched_spd_matrices_equal_the_loop(dim, mu, L):
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    loop = np.stack([spd_with_spectrum(dim, mu, L, a) for _ in range(23)])
    assert np.array_equal(spd_with_spectrum_batch(23, dim, mu, L, b), loop)
    assert a.random() == b.random()  # the generator is left in the same state


@pytest.mark.parametrize(
    "params",
    [
        {"clients": 12, "dim": 4, "examples": 7, "noise": 0.5},
        {"clients": 30, "dim": 2, "examples": 1, "examples_max": 5, "noise": 1.0},
        {"clients": 9, "dim": 1, "examples": 3, "examples_max": 20, "heterogeneity": 0.2},
    ],
)
@pytest.mark.parametrize("seed", [0, 4])
def test_quadratic_equals_the_loop(params, seed):
    full = {"mu": 1.0, "L": 10.0, "heterogeneity": 1.0, "noise": 0.0, **params}
    task = build_task("quadratic", params, seed)
    assert _same_train(task.train, _quadratic_loop(full, seed))


@pytest.mark.parametrize(
    "params",
    [
        {"clients": 20, "dim": 6, "classes": 4, "min_examples": 1, "log_mean_examples": 1.0},
        {"clients": 15, "dim": 3, "classes": 3, "iid": True, "min_examples": 2},
        {"clients": 8, "alpha": 0.5, "beta": 0.0, "test_fraction": 0.3, "max_examples": 60},
    ],
)
@pytest.mark.parametrize("seed", [0, 2])
def test_synthetic_equals_the_loop(params, seed):
    task = build_task("synthetic", params, seed)
    train, test_x, test_y = _synthetic_task_loop(params, seed)
    assert _same_train(task.train, train)
    assert _same(task.test.inputs, test_x) and _same(task.test.targets, test_y)


def test_linreg_equals_the_loop():
    task = build_task("linreg_interp", {"clients": 11, "dim": 5, "examples": 6}, 3)
    rng = np.random.default_rng([0x4E, 3])
    w_star = rng.standard_normal(5) / np.sqrt(5)
    sd = np.sqrt(np.linspace(1.0, 10.0, 5))
    clients = []
    for _ in range(11):
        x = rng.standard_normal((6, 5)) * sd
        clients.append((torch.from_numpy(x), torch.from_numpy(x @ w_star)))
    assert _same_train(task.train, FederatedData.from_clients(clients))


@pytest.mark.parametrize("oracle", [False, True])
def test_mixed_labels_equals_the_loop(oracle):
    params = {"clients": 7, "examples": 3, "central_examples": 20, "dim": 4, "oracle": oracle}
    task = build_task("mixed_labels", params, 1)
    rng = np.random.default_rng([0x3A, 1])
    u = rng.standard_normal(4)
    mean = u / np.linalg.norm(u)

    def blob(n, m):
        return torch.from_numpy(m + rng.standard_normal((n, 4))).to(torch.float32)

    xs = [blob(3, mean) for _ in range(7)]
    central = blob(20, -mean)
    ones = lambda x: torch.ones(len(x), dtype=torch.long)  # noqa: E731
    if oracle:
        shares = torch.tensor_split(central, 7)
        data = [
            (torch.cat([x, s]), torch.cat([ones(x), ones(s) * 0]))
            for x, s in zip(xs, shares, strict=True)
        ]
    else:
        data = [(x, ones(x)) for x in xs]
        assert _same(task.central.data.inputs, central)
    ids = [f"client_{k:04d}" for k in range(7)]
    assert _same_train(task.train, FederatedData.from_clients(data, ids))


def test_mixed_quadratic_equals_the_loop():
    from fedtune.trainers.theory.instances import spd_with_spectrum as spd

    p = {"clients": 6, "dim": 3, "examples": 4, "noise": 0.3, "iid": False, "heterogeneity": 0.5}
    task = build_task("mixed_quadratic", p, 2)
    rng = np.random.default_rng([0x3B, 2])
    spd(3, 1.0, 10.0, rng)  # A_f
    c_f = rng.standard_normal(3) / np.sqrt(3)
    A = np.stack([spd(3, 1.0, 10.0, rng) for _ in range(6)])
    c = np.tile(c_f, (6, 1)) + rng.standard_normal((6, 3)) * (0.5 / np.sqrt(3))
    spd(3, 1.0, 10.0, rng)  # A_c
    rng.standard_normal(3)  # u
    clients = [(_rows_loop(rng, A[i], c[i], 4, 0.3), torch.zeros(4)) for i in range(6)]
    assert _same_train(task.train, FederatedData.from_clients(clients))
