"""Model registry: ``name -> factory(input_shape, num_outputs) -> nn.Module``."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

from fedtune.errors import ConfigError

__all__ = ["build_model", "model_names", "register_model"]

Factory = Callable[[tuple[int, ...], int], nn.Module]
_MODELS: dict[str, Factory] = {}


def register_model(name: str) -> Callable[[Factory], Factory]:
    def deco(factory: Factory) -> Factory:
        _MODELS[name] = factory
        return factory

    return deco


def _load() -> None:
    for mod in ("basic", "paper"):
        try:
            importlib.import_module(f"{__package__}.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{mod}":
                raise


def model_names() -> list[str]:
    _load()
    return sorted(_MODELS)


def build_model(
    name: str, input_shape: tuple[int, ...], num_outputs: int, generator: torch.Generator
) -> nn.Module:
    """Build model ``name`` with parameters drawn from ``generator`` (explicit randomness)."""
    _load()
    if name not in _MODELS:
        raise ConfigError(
            "task.model", f"unknown model {name!r} (known: {', '.join(sorted(_MODELS))})"
        )
    # nn.Module initialisers use the global RNG: fork it and seed from our generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _MODELS[name](tuple(input_shape), int(num_outputs))
