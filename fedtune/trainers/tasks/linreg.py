"""``linreg_interp``: interpolating (noiseless, realisable) federated linear regression.

The FedAvg-with-MaSS setting of Qu et al. 2020 (arXiv:2007.05690) and prediction 35 of
docs/explanation/algorithms.md §8: device k holds n_k = ``examples`` pairs (x, z) with features
x ~ N(0, diag(σ₁², …, σ_d²)), variances linearly spaced in [``var_min``, ``var_max``], and labels
z = xᵀw* with one w* ~ N(0, I/d) shared by all devices, so F(w*) = 0 and every F_k(w*) = 0. The
per-example loss is ½ (wᵀx − z)², hence F_k(w) = (1/2n_k) Σ_j (wᵀx_{k,j} − z_{k,j})²
= ½‖w − w*‖²_{H^k}. The model is w ∈ ℝ^d without bias (inputs are the features,
``meta["linear_regression"]``), which lets FedAvg-MaSS estimate the theorem's constants from the
data; w₀ ~ N(0, init_scale²/d · I) from the trial seed (0 = start at the origin).
``meta["w_star"]`` is w*.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from ..typed import from_mapping
from .base import InMemoryData, Task
from .params import LinRegParams

__all__ = ["LinRegParams", "LinearRegression", "build_linreg", "squared_error"]


class LinearRegression(nn.Module):
    """Prediction xᵀw (no bias)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(dim))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs @ self.w


def squared_error(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example ½ (o − z)²."""
    return 0.5 * (outputs - targets) ** 2


def build_linreg(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(LinRegParams, params, "task")
    rng = np.random.default_rng([0x4E, seed])
    w_star = rng.standard_normal(p.dim) / np.sqrt(p.dim)
    sd = np.sqrt(np.linspace(p.var_min, p.var_max, p.dim))
    # one draw for every client (the same stream as one draw per client, in order); z per
    # client as a stacked matmul, i.e. the same BLAS call per client as before
    x = rng.standard_normal((p.clients, p.examples, p.dim)) * sd
    z = x @ w_star
    inputs = torch.from_numpy(x.reshape(-1, p.dim))
    targets = torch.from_numpy(z.reshape(-1))

    def model_fn(gen: torch.Generator) -> LinearRegression:
        model = LinearRegression(p.dim).double()
        with torch.no_grad():
            model.w.copy_(
                torch.randn(p.dim, generator=gen, dtype=torch.float64)
                * p.init_scale
                / np.sqrt(p.dim)
            )
        return model

    return Task(
        name="linreg_interp",
        train=InMemoryData.from_arrays(
            inputs, targets, torch.full((p.clients,), p.examples, dtype=torch.long)
        ),
        model_fn=model_fn,
        loss_fn=squared_error,
        meta={"w_star": w_star, "linear_regression": True, "feature_sd": sd},
    )
