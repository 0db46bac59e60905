"""Declarative search spaces: one YAML file per algorithm family, shipped in the package.

An algorithm that no shipped space lists (a user's method) gets the space its parts declare
(:func:`declared_space`); every searched hyperparameter must stay inside its declared bounds
(:func:`declaration_problem`). Each parameter has a distribution (``type: float|int|categorical``, ``low``/``high``, ``log``,
``step``, ``choices``), a ``default``, an optional ``grid`` for grid search (``half-decade`` =
the papers' {10⁻³, 10^−2.5, …, 10¹} learning-rate grid, Charles & Konečný 2020 (arXiv:2007.00878)
§8.3), an optional condition (``when: 'server_opt == "momentum"'``), an optional ``tie`` (value
copied from another parameter: the W = P = C heuristic of Charles & Konečný 2020 §9) and
``enabled`` (shipped spaces carry the papers' fixed settings, e.g. K, switched off).

    space = merge(load_space("fedavgm"), {"client_lr": {"high": 1.0}})
    params = suggest(trial, space)          # {"hparams.client_lr": 0.03, ...}
    config = apply_overrides(base_config, params)

``suggest``/``to_optuna_distributions``/``grid_search_space``/``enqueue`` need Optuna and are
imported lazily.
"""

from __future__ import annotations

from typing import Any

from .assign import default_point, grid_points, is_active, resolve_values
from .conditions import Condition, parse_condition
from .decl import ParamDecl
from .declared import declaration_problem, declared_space, default_space, space_entry
from .loader import (
    SHIPPED_DIR,
    combine,
    combine_errors,
    load_space,
    merge,
    parse_space,
    shipped_spaces,
    space_for_algorithm,
)
from .model import Parameter, ParamType, SearchSpace, resolve_path

__all__ = [
    "SHIPPED_DIR",
    "Condition",
    "ParamDecl",
    "ParamType",
    "Parameter",
    "SearchSpace",
    "combine",
    "combine_errors",
    "declaration_problem",
    "declared_space",
    "default_point",
    "default_space",
    "enqueue",
    "grid_points",
    "grid_search_space",
    "is_active",
    "load_space",
    "merge",
    "parse_condition",
    "parse_space",
    "resolve_path",
    "resolve_values",
    "shipped_spaces",
    "space_entry",
    "space_for_algorithm",
    "suggest",
    "to_optuna_distributions",
]

_OPTUNA_NAMES = ("enqueue", "grid_search_space", "suggest", "to_optuna_distributions")


def __getattr__(name: str) -> Any:
    if name in _OPTUNA_NAMES:
        from . import optuna_adapter

        return getattr(optuna_adapter, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
