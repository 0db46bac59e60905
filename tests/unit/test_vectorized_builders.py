"""The vectorized task builders produce the data of the per-client loops they replaced, bit for
bit (same seed, same draws in the same order): the loops are kept here as the reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedtune.trainers import build_task
from fedtune.trainers.tasks import FederatedData
from fedtune.trainers.theory.instances import spd_with_spectrum, spd_with_spectrum_batch
from tests.benchmarks import load_benchmark


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


@pytest.fixture(scope="module")
def loops():
    return load_benchmark("_loop_builders.py")


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
def test_quadratic_equals_the_loop(loops, params, seed):
    task = build_task("quadratic", params, seed)
    assert _same_train(task.train, loops.quadratic_loop(params, seed))


@pytest.mark.parametrize(
    "params",
    [
        {"clients": 20, "dim": 6, "classes": 4, "min_examples": 1, "log_mean_examples": 1.0},
        {"clients": 15, "dim": 3, "classes": 3, "iid": True, "min_examples": 2},
        {"clients": 8, "alpha": 0.5, "beta": 0.0, "test_fraction": 0.3, "max_examples": 60},
    ],
)
@pytest.mark.parametrize("seed", [0, 2])
def test_synthetic_equals_the_loop(loops, params, seed):
    task = build_task("synthetic", params, seed)
    train, test_x, test_y = loops.synthetic_task_loop(params, seed)
    assert _same_train(task.train, train)
    assert _same(task.test.inputs, test_x) and _same(task.test.targets, test_y)


def test_linreg_equals_the_loop(loops):
    params = {"clients": 11, "dim": 5, "examples": 6}
    task = build_task("linreg_interp", params, 3)
    assert _same_train(task.train, loops.linreg_loop(params, 3))


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


def test_mixed_quadratic_equals_the_loop(loops):
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
    clients = [(loops.rows_loop(rng, A[i], c[i], 4, 0.3), torch.zeros(4)) for i in range(6)]
    assert _same_train(task.train, FederatedData.from_clients(clients))
