"""``fedlab_resmlp``: a small residual MLP for tabular features.

    h₀ = tanh(W₀ x + b₀)                    [B, width]
    h₁ = h₀ + tanh(W₁ h₀ + b₁)              residual block
    logits = W₂ h₁ + b₂                     [B, num_outputs]

A pure function of (parameters, inputs) — no dropout, no BatchNorm — so fedtune's vectorized
runner can ``vmap`` the clients' local steps (the contract of ``fedtune.extend``). Parameters are
drawn by ``nn.Linear``'s initialisers, which ``fedtune.extend.build_model`` seeds from the
trial's generator: the same trial seed gives the same initial model.
"""

from __future__ import annotations

import torch
from torch import nn

from fedtune.extend import register_model

__all__ = ["ResidualMLP", "resmlp"]

WIDTH = 32


class ResidualMLP(nn.Module):
    def __init__(self, features: int, num_outputs: int, width: int = WIDTH) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.block = nn.Linear(width, width)
        self.out = nn.Linear(width, num_outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = h + torch.tanh(self.block(h))
        return self.out(h)


@register_model("fedlab_resmlp")
def resmlp(input_shape: tuple[int, ...], num_outputs: int) -> nn.Module:
    """``input_shape`` is ``(features,)``; the logits have ``num_outputs`` columns."""
    (features,) = input_shape
    return ResidualMLP(features, num_outputs)
