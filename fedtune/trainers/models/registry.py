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
    """Register a model factory, ``factory(input_shape, num_outputs) -> nn.Module``, as a decorator.

    Args:
        name: The model's name, as a task's ``model`` names it.

    Returns:
        The decorator; it returns the factory unchanged.

    Raises:
        CodeError: ``name`` is empty or already registered by another module.
    """

    def deco(factory: Factory) -> Factory:
        REGISTRY.add(name, factory)
        return factory

    return deco


def model_names() -> list[str]:
    """List the names of every registered model.

    Returns:
        The names, sorted.
    """
    return sorted(REGISTRY.all())


def model_origin(name: str) -> Origin:
    return REGISTRY.origin(name)


def build_model(
    name: str, input_shape: tuple[int, ...], num_outputs: int, generator: torch.Generator
) -> nn.Module:
    """Build a registered model with its parameters drawn from ``generator`` only.

    Args:
        name: The model's name.
        input_shape: The shape of one example.
        num_outputs: The number of outputs (e.g. classes).
        generator: The source of the initial parameters.

    Returns:
        The model.

    Raises:
        ConfigError: No model has this name.
    """
    factory = REGISTRY.get(name)
    # nn.Module initialisers use the global RNG: fork it and seed from our generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(tuple(input_shape), int(num_outputs))
