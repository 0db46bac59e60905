"""Tasks with a centralized dataset for Mixed FL (Augenstein et al. 2022 (arXiv:2205.13655),
docs/explanation/algorithms.md §5).

``mixed_labels`` — the label-shift setting of the paper's smile experiment (§5.1), as
prediction 33 of docs/explanation/algorithms.md §8: binary logistic regression on two Gaussian
classes x ~ N(±s·u, I_d) (u a random unit vector). Federated clients hold **only label-1** examples,
the server holds **only label-0** examples, and the test split is balanced. The objective is
f = w_f·(mean client loss) + w_c·(mean central loss) with w_c = ``central_weight`` and
w_f = 1 − w_c (``task.meta["federated_weight"]``). ``oracle: true`` is the baseline that trains
on the union: each client additionally holds an equal share of the label-0 examples and there is
no central data (train it with ``fedavg``). FedAvg on the non-oracle task sees one class only.

``mixed_quadratic`` — exact quadratics for the Mixed-FL checks (predictions 27–32): client i
has f_i(x; z) = ½ (x − c_i)ᵀ A_i (x − c_i) + ξ_zᵀ x and the server
f_c(x; z) = ½ (x − c_c)ᵀ A_c (x − c_c) + ξ_zᵀ x (ξ centred, E‖ξ‖² = noise², per side), in the
row format of the ``quadratic`` task. ``iid: true`` gives every client the same (A_f, c_f);
otherwise c_i = c_f + heterogeneity·N(0, I/d) and A_i are drawn independently, or all equal to
A_f with ``shared_hessian: true`` (the equal-Hessian case of docs/explanation/algorithms.md §4.5,
where FedGA, SCAFFOLD-GA and FedAvg coincide).
c_c = c_f + ``central_distance``·u, so distance 0 with A_c ≠ A_f still has G̃ > 0 away from
the optimum. ``meta["x_star"]`` is the minimiser of w_f·mean_i f_i + w_c·f_c.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..models import build_model
from ..theory.instances import spd_with_spectrum, spd_with_spectrum_batch
from ..typed import from_mapping
from .base import CentralData, Dataset, InMemoryData, Task
from .losses import accuracy, cross_entropy
from .params import MixedLabelsParams, MixedQuadraticParams
from .quadratic import (
    per_example_value,
    quadratic_model_fn,
    quadratic_rows,
    quadratic_rows_batch,
)

__all__ = [
    "MixedLabelsParams",
    "MixedQuadraticParams",
    "build_mixed_labels",
    "build_mixed_quadratic",
]


def _blob(rng: np.random.Generator, n: int, mean: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(mean + rng.standard_normal((n, mean.shape[0]))).to(torch.float32)


def _ids(clients: int) -> list[str]:
    return [f"client_{k:04d}" for k in range(clients)]


def _interleave(
    a: tuple[torch.Tensor, torch.Tensor],
    b: tuple[torch.Tensor, torch.Tensor],
    count_a: torch.Tensor,
    count_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Client k's rows = its ``count_a[k]`` rows of ``a`` then its ``count_b[k]`` rows of ``b``
    (each side client after client); returns inputs, targets, sizes."""
    sizes = count_a + count_b
    start = torch.cumsum(sizes, 0) - sizes
    pos_a = torch.repeat_interleave(start - (torch.cumsum(count_a, 0) - count_a), count_a)
    pos_b = torch.repeat_interleave(start + count_a - (torch.cumsum(count_b, 0) - count_b), count_b)
    rows_a = pos_a + torch.arange(len(pos_a))
    rows_b = pos_b + torch.arange(len(pos_b))
    out = []
    for x, y in zip(a, b, strict=True):
        t = x.new_empty((int(sizes.sum()), *x.shape[1:]))
        t[rows_a], t[rows_b] = x, y
        out.append(t)
    return out[0], out[1], sizes


def build_mixed_labels(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(MixedLabelsParams, params, "task")
    rng = np.random.default_rng([0x3A, seed])
    u = rng.standard_normal(p.dim)
    mean = p.separation * u / np.linalg.norm(u)
    clients = _blob(rng, p.clients * p.examples, mean)  # every client's rows, client by client
    central = _blob(rng, p.central_examples, -mean)
    half = p.test_examples // 2
    test_x = torch.cat([_blob(rng, half, mean), _blob(rng, p.test_examples - half, -mean)])
    test_y = torch.cat(
        [torch.ones(half, dtype=torch.long), torch.zeros(p.test_examples - half, dtype=torch.long)]
    )
    counts = torch.full((p.clients,), p.examples, dtype=torch.long)
    labels = torch.ones(len(clients), dtype=torch.long)
    if p.oracle:
        # client k: its label-1 rows, then its share of the central rows (tensor_split's shares)
        share = torch.tensor(
            [len(s) for s in torch.tensor_split(torch.arange(len(central)), p.clients)]
        )
        inputs, labels, counts = _interleave(
            (clients, labels), (central, torch.zeros(len(central), dtype=torch.long)), counts, share
        )
        train = InMemoryData.from_arrays(inputs, labels, counts, _ids(p.clients))
        central_data = None
    else:
        train = InMemoryData.from_arrays(clients, labels, counts, _ids(p.clients))
        zeros = torch.zeros(len(central), dtype=torch.long)
        central_data = CentralData(Dataset(central, zeros), weight=p.central_weight)
    return Task(
        name="mixed_labels",
        train=train,
        model_fn=functools.partial(build_model, p.model, (p.dim,), 2),
        loss_fn=cross_entropy,
        test=Dataset(test_x, test_y),
        central=central_data,
        metric_fns={"accuracy": accuracy},
        meta={"federated_weight": 1.0 if p.oracle else 1.0 - p.central_weight, "oracle": p.oracle},
    )


def build_mixed_quadratic(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(MixedQuadraticParams, params, "task")
    rng = np.random.default_rng([0x3B, seed])
    A_f = spd_with_spectrum(p.dim, p.mu, p.L, rng)
    c_f = rng.standard_normal(p.dim) / np.sqrt(p.dim)
    same = p.iid or p.shared_hessian
    A = (
        np.broadcast_to(A_f, (p.clients, p.dim, p.dim)).copy()
        if same
        else spd_with_spectrum_batch(p.clients, p.dim, p.mu, p.L, rng)
    )
    offsets = rng.standard_normal((p.clients, p.dim)) * (p.heterogeneity / np.sqrt(p.dim))
    c = np.tile(c_f, (p.clients, 1)) + (0.0 if p.iid else offsets)
    A_c = spd_with_spectrum(p.dim, p.mu, p.L, rng)
    u = rng.standard_normal(p.dim)
    c_c = c_f + p.central_distance * u / np.linalg.norm(u)
    sizes = np.full(p.clients, p.examples, dtype=np.int64)
    rows = quadratic_rows_batch(rng, A, c, sizes, p.noise)
    central = quadratic_rows(rng, A_c, c_c, p.central_examples, p.central_noise)
    H = p.federated_weight * A.mean(0) + p.central_weight * A_c
    b = p.federated_weight * np.einsum("ijk,ik->j", A, c) / p.clients + p.central_weight * A_c @ c_c

    return Task(
        name="mixed_quadratic",
        train=InMemoryData.from_arrays(rows, torch.zeros(len(rows)), torch.from_numpy(sizes)),
        model_fn=quadratic_model_fn(p.dim, p.init_scale),
        loss_fn=per_example_value,
        central=CentralData(
            Dataset(central, torch.zeros(p.central_examples)), weight=p.central_weight
        ),
        meta={
            "federated_weight": p.federated_weight,
            "A": A,
            "c": c,
            "A_c": A_c,
            "c_c": c_c,
            "x_star": np.linalg.solve(H, b),
        },
    )
