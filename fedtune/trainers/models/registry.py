"""Model registry: ``name -> factory(input_shape, num_outputs) -> nn.Module``.

Built-in models and user models (entry point ``fedtune.models``, a study's ``code:``) share one
registry (see :mod:`fedtune.trainers.plugins`); users register with :func:`register_model`, the
built-ins are the table :data:`_BUILTIN`, whose factories are imported when a model is built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from ..plugins import Deferred, Origin, Registry

if TYPE_CHECKING:
    import torch
    from torch import nn

__all__ = ["build_model", "model_names", "model_origin", "register_model"]

#: ``factory(input_shape, num_outputs) -> nn.Module``; no dropout/BatchNorm (pure function of
#: parameters and inputs, so the vectorized runner can vmap it)
Factory = Callable[[tuple[int, ...], int], "nn.Module"]


#: the built-in models: (name, module, factory); a factory's module (and torch) is imported
#: when the model is built (:class:`~fedtune.trainers.plugins.Deferred`), so that a study spec's
#: model names are checked without either
_BUILTIN = (
    ("linear", "basic", "linear"),
    ("mlp", "basic", "mlp"),
    ("cnn", "basic", "cnn"),
    ("quadratic", "basic", "quadratic"),
    ("femnist_cnn", "paper", "femnist_cnn"),
    ("femnist_cnn_small", "paper", "femnist_cnn_small"),
    ("char_lstm", "paper", "char_lstm"),
    ("word_lstm", "paper", "word_lstm"),
    ("bow_logistic", "paper", "bow_logistic"),
    ("resnet18_gn", "paper", "resnet18_gn"),
)


def _builtins() -> Iterator[tuple[str, Factory, str]]:
    """The built-in models, each factory deferred to its module."""
    return (
        (name, Deferred(f"{__package__}.{module}", factory), __name__)
        for name, module, factory in _BUILTIN
    )


REGISTRY: Registry[Factory] = Registry("model", "task.model", _builtins)


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
    import torch

    factory = REGISTRY.get(name)
    # nn.Module initialisers use the global RNG: fork it and seed from our generator
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory(tuple(input_shape), int(num_outputs))
