"""Model registry: ``name -> factory(input_shape, num_outputs) -> nn.Module``.

Built-in models and user models (entry point ``fedtune.models``, a study's ``code:``) register
through the same :func:`register_model` (see :mod:`fedtune.trainers.plugins`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from ..plugins import Origin, Registry

__all__ = ["build_model", "model_names", "model_origin", "register_model"]

#: ``factory(input_shape, num_outputs) -> nn.Module``; no dropout/BatchNorm (pure function of
#: parameters and inputs, so the vectorized runner can vmap it)
Factory = Callable[[tuple[int, ...], int], nn.Module]


def _load() -> None:
    for mod in ("basic", "paper"):
        try:
            importlib.import_module(f"{__package__}.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{mod}":
                raise


REGISTRY: Registry[Factory] = Registry("model", "task.model", _load)


def register_model(name: str) -> Callable[[Factory], Factory]:
    """Decorator: register ``factory(input_shape, num_outputs) -> nn.Module`` as ``name``."""

    def deco(factory: Factory) -> Factory:
        REGISTRY.add(name, factory)
        return factory

    return deco


def model_names() -> list[str]:
    return sorted(REGISTRY.all())


def model_origin(name: str) -> Origin:
    return REGISTRY.origin(name)


def build_model(
    name: str, input_shape: tuple[int, ...], num_outputs: int, generator: torch.Generator
) -> nn.Module:
    """Build model ``name`` with parameters drawn from ``generator`` (explicit randomness)."""
    factory = REGISTRY.get(name)
    # nn.Module initialisers use the global RNG: fork it and seed from our generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(tuple(input_shape), int(num_outputs))
