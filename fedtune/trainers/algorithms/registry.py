"""Algorithm registry: every method is a *recipe* — parts plus defaults — not a class.

The plain local-update methods (FedAvg, FedSGD, Reptile, FedProx, …;
docs/explanation/algorithms.md §1.5) are the recipes of :mod:`.local_methods`, the methods of the
other papers those of :mod:`.extensions`; the registry registers both when it is first used. Both
modules, and this one, import no part of the engine: a built-in method's round is imported when
it is built.

What a recipe is and how its hyperparameters are declared: :mod:`.recipe`. This module holds
recipes by name; other modules add methods with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fedtune.errors import ConfigError

from ..hparams import validate_hparams
from ..plugins import Origin, Registry
from .recipe import Recipe

if TYPE_CHECKING:
    from ..config import TrialConfig
    from ..tasks.base import Task
    from .base import Algorithm

__all__ = [
    "Recipe",
    "algorithm_origin",
    "algorithms",
    "get_recipe",
    "local_epochs_refusal",
    "register",
    "resolve",
]


def _builtins() -> Iterator[tuple[str, Recipe, str]]:
    """The built-in recipes (``local_methods.RECIPES``, ``extensions.RECIPES``: their metadata,
    no torch), registered by the registry: no import side effect."""
    from . import extensions, local_methods

    return (
        (recipe.name, recipe, module.__name__)
        for module in (local_methods, extensions)
        for recipe in module.RECIPES
    )


REGISTRY: Registry[Recipe] = Registry("algorithm", "algorithm", _builtins)


def register(recipe: Recipe) -> Recipe:
    """Register ``recipe`` (built-ins and user code alike; see :mod:`fedtune.trainers.plugins`)."""
    REGISTRY.add(recipe.name, recipe)
    return recipe


def algorithms() -> dict[str, Recipe]:
    """List every registered algorithm: built in, from entry points and from loaded code.

    Returns:
        The recipes by name.
    """
    return REGISTRY.all()


def get_recipe(name: str) -> Recipe:
    return REGISTRY.get(name)


def algorithm_origin(name: str) -> Origin:
    """Say where an algorithm was registered.

    Args:
        name: The algorithm's name.

    Returns:
        Its origin (built in, an entry point's distribution or a study's code).

    Raises:
        ConfigError: No algorithm has this name.
    """
    return REGISTRY.origin(name)


def effective_hparams(recipe: Recipe, config: TrialConfig) -> Any:
    """Recipe defaults < user values < recipe-fixed values, validated against the parts'
    declarations (an instance of ``recipe.hparams_type``); unknown-to-recipe keys are errors."""
    given = recipe.given_hparams(config.hparams)
    if recipe.check is not None:
        recipe.check(config)
    hp = validate_hparams(recipe.hparams_type, {**recipe.defaults, **given, **recipe.fixed})
    if hp.server_opt not in recipe.server_opts:
        raise ConfigError(
            "hparams.server_opt",
            f"algorithm {recipe.name!r} supports {', '.join(recipe.server_opts)}, got {hp.server_opt!r}",
        )
    return hp


def local_steps_of(recipe: Recipe, config: TrialConfig) -> int:
    """K of the run. With ``train.local_epochs`` the clients run ⌈E·n_i/B⌉ steps each round
    (see ``steps.py``) and K is only the nominal size the parts are built with (the recipe's
    default); methods whose definition needs one fixed K reject local_epochs here."""
    if config.train.local_epochs is not None:
        _check_local_epochs(recipe, config)
        return recipe.default_local_steps
    given = config.train.local_steps
    if recipe.fixed_local_steps is not None:
        if given is not None and given != recipe.fixed_local_steps:
            raise ConfigError(
                "train.local_steps",
                f"algorithm {recipe.name!r} uses exactly {recipe.fixed_local_steps} local step(s)",
            )
        return recipe.fixed_local_steps
    return recipe.default_local_steps if given is None else given


def local_epochs_refusal(recipe: Recipe, theta: tuple[float, ...] = ()) -> str:
    """Why ``recipe`` (with an explicit Θ ``theta``) cannot run ``train.local_epochs``; ""
    when it can."""
    if recipe.fixed_local_steps is not None:
        return f"it runs exactly {recipe.fixed_local_steps} local step(s)"
    if theta:
        return "an explicit hparams.theta fixes K(Θ) = its length"
    return recipe.fixed_k_reason


def _check_local_epochs(recipe: Recipe, config: TrialConfig) -> None:
    theta = config.hparams.get("theta", ())
    reason = local_epochs_refusal(recipe, theta)
    if reason:
        raise ConfigError(
            "train.local_epochs",
            f"algorithm {recipe.name!r} needs a fixed train.local_steps: {reason}",
        )


def resolve(config: TrialConfig, task: Task) -> tuple[Algorithm, Any, int]:
    """Validate ``config`` against its algorithm's recipe and build the algorithm."""
    recipe = get_recipe(config.algorithm)
    hp = effective_hparams(recipe, config)
    steps = local_steps_of(recipe, config)
    if (
        recipe.max_clients_per_round
        and config.train.clients_per_round > recipe.max_clients_per_round
    ):
        raise ConfigError(
            "train.clients_per_round",
            f"algorithm {recipe.name!r} allows at most {recipe.max_clients_per_round}",
        )
    if recipe.needs_central and task.central is None:
        raise ConfigError(
            "task", f"algorithm {recipe.name!r} needs a task with central data (e.g. mixed_labels)"
        )
    return recipe.build(recipe, hp, steps, task), hp, steps
