"""Assignments of a space without Optuna: resolve conditions/ties, defaults, grid points.

An *assignment* is ``{config path: value}`` over the *active* parameters: enabled, with a true
condition (evaluated on the values assigned so far, in dependency order). A tied parameter is
active when its target is and gets the target's value. Disabled parameters never appear: their
value comes from the study's fixed configuration.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from fedtune.errors import ConfigError

from .model import Parameter, SearchSpace

__all__ = ["default_point", "grid_points", "is_active", "resolve_values"]


def is_active(param: Parameter, assigned: Mapping[str, Any]) -> bool:
    """Whether ``param`` takes part given the values assigned to earlier parameters."""
    if not param.enabled:
        return False
    if param.when is not None and not param.when(assigned):
        return False
    return not param.tied or param.tie in assigned


def resolve_values(
    space: SearchSpace, values: Mapping[str, Any], *, fill_defaults: bool = True
) -> dict[str, Any]:
    """Complete ``values`` (keys: paths or names) into an assignment of ``space``.

    Ties are (re)computed, inactive parameters dropped, missing ones set to their default
    (``Parameter.initial``) or, with ``fill_defaults=False``, reported as an error.
    """
    given = {}
    for key, value in values.items():
        param = space.find(key)
        given[param.path if param else key] = value
    out: dict[str, Any] = {}
    for p in space.parameters:
        if not is_active(p, out):
            continue
        if p.tied:
            out[p.path] = out[p.tie]
        elif p.path in given:
            out[p.path] = given[p.path]
        elif fill_defaults:
            out[p.path] = p.initial()
        else:
            raise ConfigError(p.path, "no value given for an active parameter", space.source)
    return out


def default_point(space: SearchSpace) -> dict[str, Any]:
    """The assignment made of every parameter's default."""
    return resolve_values(space, {})


def grid_points(space: SearchSpace) -> list[dict[str, Any]]:
    """Every combination of grid values of the active parameters (define-by-run order).

    A conditional parameter only branches where its condition holds, so the grid holds no
    duplicate points. Raises ``ConfigError(parameters.<name>.grid)`` if an active parameter has
    no finite grid (a float without ``grid``/``step``).
    """
    for p in space.enabled:
        if not p.tied and p.grid_values() is None:
            raise ConfigError(
                f"parameters.{p.name}.grid",
                "no grid: give `grid: half-decade`, `grid: decade` or a list of values",
                space.source,
            )
    return list(_expand(space.parameters, {}))


def _expand(params: tuple[Parameter, ...], assigned: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if not params:
        yield dict(assigned)
        return
    p, rest = params[0], params[1:]
    if not is_active(p, assigned):
        yield from _expand(rest, assigned)
        return
    values = (assigned[p.tie],) if p.tied else p.grid_values()
    for v in values:
        assigned[p.path] = v
        yield from _expand(rest, assigned)
        del assigned[p.path]
