"""Per-example losses and metrics shared by the classification tasks.

``cross_entropy(o, y) = −log softmax(o)[y]`` and ``accuracy(o, y) = [argmax o = y]``, both
``[B, C] × [B] -> [B]`` and vmappable (``gather`` rather than ``F.cross_entropy``'s fused kernel
so that the vectorized runner needs no fallback).
"""

from __future__ import annotations

import torch

__all__ = ["accuracy", "cross_entropy"]


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy of logits ``[B, C]`` against class ids ``[B]``."""
    logp = torch.log_softmax(outputs, dim=-1)
    return -logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example 0/1 accuracy of the arg-max prediction."""
    return (outputs.argmax(-1) == targets.long()).to(outputs.dtype)
