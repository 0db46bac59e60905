"""Which configurations may share a pack (:func:`pack_refusal`) and with whom (:func:`pack_key`):
what the method's recipe declares (``Recipe.packable``, ``Recipe.member_hparams``) and what
the configurations have in common; and whether a member's round is the form the pack runs
(:func:`packed_round`), which a recipe with its own ``build`` promises by ``packable=True``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from fedtune.errors import CodeError

from .algorithms import Algorithm, LocalUpdate, get_recipe
from .algorithms.local_update import mean_aggregator
from .algorithms.registry import effective_hparams
from .config import TrialConfig
from .parsing import parse_trial_config
from .typed import to_dict

__all__ = ["pack_key", "pack_refusal", "packed_round", "parse"]

#: train fields a member may set on its own
_MEMBER_TRAIN = ("local_steps", "local_epochs", "rounds", "divergence_factor", "runner")


def parse(config: TrialConfig | Mapping[str, Any]) -> TrialConfig:
    return config if isinstance(config, TrialConfig) else parse_trial_config(config)


def pack_refusal(config: TrialConfig | Mapping[str, Any]) -> str | None:
    """Say why a configuration cannot join a pack (it then runs one per process).

    Args:
        config: The trial's configuration, parsed or as a mapping.

    Returns:
        One line giving the reason, or None when it can be packed.

    Raises:
        ConfigError: An invalid configuration.
    """
    cfg = parse(config)
    recipe = get_recipe(cfg.algorithm)
    if recipe.pack_refusal is not None:
        return recipe.pack_refusal
    hp = effective_hparams(recipe, cfg)
    if hp.server_bias_correction:
        return (
            "server_bias_correction raises β to the step count as a Python power, not "
            "vectorised: one configuration per process"
        )
    return None


def pack_key(config: TrialConfig | Mapping[str, Any]) -> str:
    """Give the key that configurations sharing a pack must have in common.

    Everything but the searched scalars: task (and data seed), algorithm, the server optimizer
    and its form, the train section less ``local_steps``, ``local_epochs``, ``rounds``,
    ``divergence_factor`` and ``runner``, the hyperparameters outside the recipe's
    ``member_hparams``, and the user code. The trial seed, the recipe's ``member_hparams``
    (by default every one of γ, η, α, Θ, β, β₁, β₂, ε it declares) and the decay section may
    differ.

    Args:
        config: The trial's configuration, parsed or as a mapping.

    Returns:
        A JSON string; equal keys can share a :class:`PackedTrainer`.
    """
    cfg = parse(config)
    recipe = get_recipe(cfg.algorithm)
    hp = effective_hparams(recipe, cfg)
    members = recipe.member_hparams or ()
    shared = {
        "task": cfg.task.to_dict(),
        "algorithm": cfg.algorithm,
        "train": {
            f.name: to_dict(getattr(cfg.train, f.name))
            for f in dataclasses.fields(cfg.train)
            if f.name not in _MEMBER_TRAIN
        },
        "hparams": {k: v for k, v in dataclasses.asdict(hp).items() if k not in members},
        "code": None if cfg.code is None else cfg.code.model_dump(),
    }
    return json.dumps(shared, sort_keys=True, default=str)


def packed_round(config: TrialConfig, algorithm: Algorithm, hp: Any) -> LocalUpdate:
    """Check that a member's round is the form a pack runs in its place.

    A pack runs LocalUpdate's round over stacked members: each member's client rule (its Θ,
    units and Θ preset; γ and α from its hyperparameters), the recipe's ``packed_aggregator``
    (else the weighted mean) and the server optimizer its hyperparameters name. A recipe's
    own ``build`` declared ``packable=True`` must return such a round.

    Args:
        config: The member's configuration.
        algorithm: Its round, as the recipe built it.
        hp: Its validated hyperparameters.

    Returns:
        The round.

    Raises:
        CodeError: The round is not of that form (at ``algorithm.build``).
    """
    recipe = get_recipe(config.algorithm)
    problem = ""
    if not isinstance(algorithm, LocalUpdate):
        problem = f"a {type(algorithm).__name__}, not a LocalUpdate"
    elif algorithm.rule.second_order:
        problem = "a second-order client rule, which has no masked form"
    elif algorithm.rule.prox_alpha != hp.prox_alpha:
        problem = (
            f"a client rule with α = {algorithm.rule.prox_alpha}, not hparams.prox_alpha = "
            f"{hp.prox_alpha} (a pack applies each member's prox_alpha)"
        )
    elif algorithm.rule.units != recipe.units:
        problem = (
            f"a client rule in {algorithm.rule.units!r} units, not the recipe's {recipe.units!r}"
        )
    elif recipe.packed_aggregator is None and algorithm.aggregator is not mean_aggregator:
        problem = (
            "a round with its own aggregator, and the recipe gives no packed_aggregator (a pack "
            "otherwise takes the weighted mean)"
        )
    if problem:
        raise CodeError(
            "algorithm.build",
            f"algorithm {recipe.name!r} packs (packable=True), but its build returned {problem}",
        )
    return algorithm
