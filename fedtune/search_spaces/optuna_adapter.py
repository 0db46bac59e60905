"""Search spaces -> Optuna: distributions, define-by-run sampling, grids.

Optuna's samplers see one distribution per *sampled* parameter, named by its config path
(``hparams.client_lr``). Conditional parameters are handled define-by-run — :func:`suggest`
walks the space in dependency order, evaluates each condition on the values drawn so far and
only asks the trial for active parameters; tied parameters are never sampled, they copy their
target's value (the Charles & Konečný 2020 (arXiv:2007.00878) §9 heuristic W = P = C). Optuna is
imported here only, so the rest of ``fedtune.search_spaces`` works without the ``tune`` extra.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from fedtune.errors import ConfigError

from .assign import is_active
from .model import Parameter, ParamType, SearchSpace

__all__ = [
    "distribution",
    "enqueue",
    "grid_search_space",
    "suggest",
    "to_optuna_distributions",
]


def distribution(param: Parameter) -> BaseDistribution:
    """The Optuna distribution of an untied parameter."""
    if param.tied:
        raise ConfigError(param.path, f"is tied to {param.tie}; it has no distribution")
    if param.type == ParamType.CATEGORICAL:
        return CategoricalDistribution(param.choices)
    if param.type == ParamType.INT:
        return IntDistribution(param.low, param.high, log=param.log, step=param.step or 1)
    return FloatDistribution(param.low, param.high, log=param.log, step=param.step)


def to_optuna_distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
    """Distributions of the enabled, unconditional, untied parameters (path -> distribution).

    This is the static part of the space (e.g. for samplers that need the space up front);
    conditional parameters need :func:`suggest`.
    """
    return {p.path: distribution(p) for p in space.drawn if p.when is None}


def suggest(trial: optuna.Trial, space: SearchSpace) -> dict[str, Any]:
    """Sample one assignment define-by-run: ``{path: value}`` over the active parameters."""
    out: dict[str, Any] = {}
    for p in space.parameters:
        if not is_active(p, out):
            continue
        if p.tied:
            out[p.path] = out[p.tie]
        elif p.type == ParamType.CATEGORICAL:
            out[p.path] = trial.suggest_categorical(p.path, p.choices)
        elif p.type == ParamType.INT:
            out[p.path] = trial.suggest_int(p.path, p.low, p.high, step=p.step or 1, log=p.log)
        else:
            out[p.path] = trial.suggest_float(p.path, p.low, p.high, step=p.step, log=p.log)
    return out


def grid_search_space(space: SearchSpace) -> dict[str, list[Any]]:
    """``search_space`` argument of ``optuna.samplers.GridSampler`` (sampled parameters only).

    Conditional parameters are included; :func:`suggest` asks for them only where active, so
    GridSampler may visit points differing only in an inactive value — use
    :func:`fedtune.search_spaces.grid_points` with :func:`enqueue` for an exact enumeration.
    """
    out: dict[str, list[Any]] = {}
    for p in space.enabled:
        if p.tied:
            continue
        values = p.grid_values()
        if values is None:
            raise ConfigError(f"parameters.{p.name}.grid", "no grid for grid search", space.source)
        out[p.path] = list(values)
    return out


def enqueue(study: optuna.Study, space: SearchSpace, point: dict[str, Any]) -> None:
    """Queue ``point`` (an assignment) as the next trial; tied values are recomputed, not sent."""
    tied = {p.path for p in space.parameters if p.tied}
    sampled = {k: v for k, v in point.items() if k not in tied}
    study.enqueue_trial(sampled, skip_if_exists=True)
