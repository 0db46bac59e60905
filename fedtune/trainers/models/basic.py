"""Small models of the built-in tasks: linear (softmax regression), MLP, small CNN, quadratic."""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["QuadraticModel"]


def _flat(shape: tuple[int, ...]) -> int:
    return int(math.prod(shape))


def linear(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(_flat(input_shape), num_outputs))


def mlp(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(_flat(input_shape), 128),
        nn.ReLU(),
        nn.Linear(128, 128),
        nn.ReLU(),
        nn.Linear(128, num_outputs),
    )


def cnn(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    """conv3×3·16 → ReLU → conv3×3·32 → ReLU → maxpool 2 → dense 64 → out (for 8×8 digits)."""
    channels, height, width = input_shape
    flat = 32 * (height // 2) * (width // 2)
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(flat, 64),
        nn.ReLU(),
        nn.Linear(64, num_outputs),
    )


class QuadraticModel(nn.Module):
    """Parameter x ∈ ℝ^d; each input row packs (vec A_i, c_i, ξ_z) and the output is the
    per-example loss f(x; z) = ½ (x − c_i)ᵀ A_i (x − c_i) + ξ_zᵀ x (ξ_z zero-mean per client)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.x = nn.Parameter(torch.zeros(dim))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        d = self.dim
        A = inputs[..., : d * d].reshape(*inputs.shape[:-1], d, d)
        c = inputs[..., d * d : d * d + d]
        xi = inputs[..., d * d + d :]
        diff = self.x - c
        # (diffᵀ A) · diff: one batched vector-matrix product, then a dot product (in a pack,
        # where vmap batches it, faster than the three-operand einsum)
        quad = 0.5 * (torch.einsum("...i,...ij->...j", diff, A) * diff).sum(-1)
        return quad + (xi * self.x).sum(-1)


def quadratic(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    n = input_shape[-1]
    d = round(math.sqrt(n + 1) - 1)  # n = d² + 2d
    if d * d + 2 * d != n:
        raise ValueError(f"quadratic inputs must have d² + 2d columns, got {n}")
    return QuadraticModel(d)
