"""The papers' random quadratic federated instances as a trainable task.

Client i holds ``examples`` examples z with per-example loss
f(x; z) = ½ (x − c_i)ᵀ A_i (x − c_i) + ξ_zᵀ x, where the noise vectors ξ_z are Gaussian with
E‖ξ‖² = G² (``noise``) and centred per client, so f_i(x) = ½ (x − c_i)ᵀ A_i (x − c_i) + const is
exact and the mini-batch gradient noise has variance ≤ G²/B
(Charles & Konečný 2020 (arXiv:2007.00878) A4). With ``examples_max`` the client sizes n_i differ
(uniform in [examples, examples_max]; the client losses f_i do not depend on n_i), e.g. for
``train.local_epochs``. A_i have spectra in [μ, L]; ‖c_i‖ ≤ ``radius``; ``heterogeneity`` ∈ [0, 1]
moves the c_i from identical to independent. The exact instance is exposed as
``task.meta["instance"]`` (:class:`~fedtune.trainers.theory.instances.QuadraticInstance`) for the
theory module. The model starts at x_0 ~ N(0, init_scale²/d · I) from the trial seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from ..models.basic import QuadraticModel
from ..theory.instances import random_instance
from ..typed import from_mapping
from .base import InMemoryData, Task
from .params import QuadraticParams


def per_example_value(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The quadratic model's output already is the per-example loss f(x; z)."""
    return outputs


def quadratic_rows(
    rng: np.random.Generator, A: np.ndarray, c: np.ndarray, n: int, noise: float
) -> torch.Tensor:
    """``n`` rows (vec A, c, ξ_z) of one quadratic client; ξ centred, E‖ξ‖² = noise²."""
    return quadratic_rows_batch(rng, A[None], c[None], np.array([n]), noise)


def quadratic_rows_batch(
    rng: np.random.Generator, A: np.ndarray, c: np.ndarray, sizes: np.ndarray, noise: float
) -> torch.Tensor:
    """The rows of clients ``A`` [C, d, d], ``c`` [C, d] with ``sizes`` [C] examples, client
    after client: the same values as one :func:`quadratic_rows` call per client in order (one
    draw of all ξ, centred per client in groups of equal size, no loop over clients)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    d, total = c.shape[1], int(sizes.sum())
    xi = rng.standard_normal((total, d)) * (noise / np.sqrt(d))
    starts = np.cumsum(sizes) - sizes
    for n in np.unique(sizes).tolist():
        of = np.flatnonzero(sizes == n)
        rows = (starts[of][:, None] + np.arange(n)).reshape(-1)
        if n == 1:
            xi[rows] = 0.0
            continue
        block = xi[rows].reshape(len(of), n, d)
        xi[rows] = (block - block.mean(1, keepdims=True)).reshape(-1, d)
    owner = np.repeat(np.arange(len(sizes)), sizes)
    rows = np.concatenate([A.reshape(len(A), d * d)[owner], c[owner], xi], axis=1)
    return torch.from_numpy(rows)


def quadratic_model_fn(dim: int, init_scale: float):
    """Model factory: x_0 ~ N(0, init_scale²/d · I) drawn from the trial's generator."""

    def model_fn(gen: torch.Generator) -> QuadraticModel:
        model = QuadraticModel(dim).double()
        with torch.no_grad():
            x0 = torch.randn(dim, generator=gen, dtype=torch.float64)
            model.x.copy_(x0 * init_scale / np.sqrt(dim))
        return model

    return model_fn


def _client_sizes(p: QuadraticParams, seed: int) -> np.ndarray:
    """n_i: all ``examples``, or uniform in [examples, examples_max] from the data seed (a
    stream of its own, so the instance does not change)."""
    if p.examples_max is None:
        return np.full(p.clients, p.examples, dtype=np.int64)
    rng = np.random.default_rng([0x9B, seed])
    return rng.integers(p.examples, p.examples_max + 1, size=p.clients).astype(np.int64)


def build(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(QuadraticParams, params, "task")
    rng = np.random.default_rng([0x9A, seed])
    inst = random_instance(p.clients, p.dim, p.mu, p.L, rng, p.radius, p.heterogeneity)
    sizes = _client_sizes(p, seed)
    rows = quadratic_rows_batch(rng, inst.A, inst.c, sizes, p.noise)
    return Task(
        name="quadratic",
        train=InMemoryData.from_arrays(rows, torch.zeros(len(rows)), torch.from_numpy(sizes)),
        model_fn=quadratic_model_fn(p.dim, p.init_scale),
        loss_fn=per_example_value,
        meta={"instance": inst, "noise": p.noise},
    )
