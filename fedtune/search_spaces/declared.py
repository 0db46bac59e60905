"""Search spaces read from the parts' hyperparameter declarations.

Every part declares its hyperparameters once (:class:`~fedtune.trainers.hparams.HParam`: type,
bounds, default search entry). Two things follow from that declaration here:

* :func:`declared_space` — the default search space of an algorithm that no shipped space
  lists (a user's method): one entry per hyperparameter a study may set (``Recipe.params``)
  whose part gives a :class:`~fedtune.trainers.hparams.Space`; the recipe's default is the
  entry's default, ``server_opt`` offers the recipe's server optimizers.
* :func:`declaration_problem` — whether a searched range (``low``/``high``, grid, default,
  choices) lies inside the declared bounds; the study spec and the shipped-space tests use it,
  so a space can narrow a declaration but never exceed it.

The shipped YAML spaces (``*.yaml`` next to this module) remain the papers' protocols (their
grids and fixed settings, Charles & Konečný 2020 (arXiv:2007.00878) §8.3); they are checked against
the declarations, not copied from them.
"""

from __future__ import annotations

from typing import Any

from fedtune.trainers.hparams import HParam

from .loader import merge, space_for_algorithm
from .model import Parameter, ParamType, SearchSpace

__all__ = ["declaration_problem", "declared_space", "default_space", "space_entry"]


def space_entry(h: HParam, recipe: Any) -> dict[str, Any] | None:
    """The space-file entry of ``h`` for ``recipe`` as plain data (None: nothing to search)."""
    s = h.space
    if s is None:
        return None
    default = recipe.defaults.get(h.name, s.default if s.default is not None else h.default)
    out: dict[str, Any] = {"enabled": s.enabled, "description": h.doc}
    if h.choices is not None or h.type is str:
        choices = list(s.choices or h.choices)
        if h.name == "server_opt":
            choices = [c for c in choices if c in recipe.server_opts]
        if len(choices) < 2:
            return None
        out.update(type="categorical", choices=choices)
        if default in choices:
            out["default"] = default
        return out
    out.update(type="int" if h.type is int else "float", low=s.low, high=s.high, log=s.log)
    if s.grid is not None:
        out["grid"] = s.grid if isinstance(s.grid, str) else list(s.grid)
    if default is not None and s.low <= default <= s.high:
        out["default"] = default
    return out


def declared_space(recipe: Any) -> SearchSpace | None:
    """The default search space of ``recipe`` from its declarations (None if it has none)."""
    entries = {}
    for name in recipe.params:
        entry = space_entry(recipe.declared[name], recipe)
        if entry is not None:
            entries[name] = entry
    if not entries:
        return None
    start = SearchSpace(recipe.name, (), algorithms=(recipe.name,))
    space = merge(start, entries, field="hparams")
    description = f"declared by the parts of {recipe.name}" + (
        f": {recipe.summary}" if recipe.summary else ""
    )
    return SearchSpace(recipe.name, space.parameters, description, (recipe.name,), None)


def default_space(algorithm: str) -> SearchSpace | None:
    """The shipped space of ``algorithm``, else the one its parts declare."""
    from fedtune.trainers.algorithms.registry import get_recipe

    return space_for_algorithm(algorithm) or declared_space(get_recipe(algorithm))


def declaration_problem(param: Parameter, h: HParam) -> str:
    """Why the searched ``param`` exceeds the declaration ``h`` ("" when it does not)."""
    if param.tied:
        return ""
    if param.type == ParamType.CATEGORICAL:
        values = [("choice", c) for c in param.choices]
    else:
        if h.type is int and param.type == ParamType.FLOAT:
            return f"{h.name} is declared int; search it with type: int"
        values = [("low", param.low), ("high", param.high)]
        values += [("grid value", v) for v in param.grid_values() or ()]
    if param.default is not None:
        values.append(("default", param.default))
    for what, value in values:
        reason = h.value_problem(value)
        if reason:
            return f"{what} {value!r} lies outside the declaration of hparams.{h.name}: {reason}"
    return ""
