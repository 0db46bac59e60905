"""Parse one parameter of a space from its declaration (:class:`~.decl.ParamDecl`).

A declaration's values each have the right kind already; here they are checked together.
Every error is ``ConfigError(f"{prefix}.{name}.{key}", reason, source)`` so a message names the
file, the parameter and what is wrong. The rules mirror what Optuna accepts, checked up front
instead of being adjusted silently: ``log`` needs ``low > 0`` and excludes ``step``; a ``step``
must divide ``high − low``; integer ``log`` ranges take no step; categorical choices are
None/bool/int/float/str.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedtune.errors import ConfigError, combine_errors
from fedtune.suggest import did_you_mean
from fedtune.trainers.typed import error_path

from .conditions import ConditionSyntaxError, parse_condition
from .decl import DISTRIBUTION_KEYS, ParamDecl, kind_of, number_of
from .model import GRID_KEYWORDS, Parameter, ParamType

__all__ = ["parse_parameter"]


class _Ctx:
    """Where a parameter entry sits (``search.parameters.client_lr``) and its file."""

    def __init__(self, field: str, source: str | None) -> None:
        self.field = field
        self.source = source

    def error(self, key: str | None, reason: str) -> ConfigError:
        """The error at ``key`` of the entry (the entry itself for None), by the one
        convention for error paths (:func:`fedtune.trainers.typed.error_path`)."""
        return ConfigError(error_path([key or ""], self.field), reason, self.source)


def _number(ctx: _Ctx, key: str, value: Any, integer: bool) -> float | int:
    try:  # a bound is one already; a grid value may still be a string such as "1e-3"
        value = number_of(value)
    except ConfigError as exc:
        raise ctx.error(key, exc.reason) from None
    if integer:
        if float(value) != int(value):
            raise ctx.error(key, f"must be an integer for an int parameter, got {value!r}")
        return int(value)
    return float(value)


def _bounds(ctx: _Ctx, decl: ParamDecl, kind: ParamType) -> dict[str, Any]:
    integer = kind == ParamType.INT
    for key in ("low", "high"):
        if getattr(decl, key) is None:
            raise ctx.error(key, f"is required for a {kind} parameter")
    if decl.choices is not None:
        raise ctx.error("choices", f"only categorical parameters have choices (this is {kind})")
    low = _number(ctx, "low", decl.low, integer)
    high = _number(ctx, "high", decl.high, integer)
    if low > high:
        raise ctx.error("low", f"low ({low}) > high ({high})")
    log = bool(decl.log)
    if log and low <= 0:
        raise ctx.error("log", f"a log scale needs low > 0, got low = {low}")
    step = decl.step
    if step is not None:
        step = _number(ctx, "step", step, integer)
        if step <= 0:
            raise ctx.error("step", f"must be > 0, got {step}")
        if log and not (integer and step == 1):
            raise ctx.error("step", "cannot be combined with log: true")
        span = (high - low) / step
        if abs(span - round(span)) > 1e-9 * max(1.0, span):
            raise ctx.error("step", f"must divide high − low = {high - low}")
    return {"low": low, "high": high, "log": log, "step": step}


def _choices(ctx: _Ctx, decl: ParamDecl) -> tuple[Any, ...]:
    for key in ("low", "high", "log", "step"):
        if key in decl.given():
            raise ctx.error(key, "a categorical parameter has choices, not bounds")
    choices = decl.choices
    if not choices:
        raise ctx.error("choices", "must be a non-empty list")
    if len({repr(c) for c in choices}) != len(choices):
        raise ctx.error("choices", "must not repeat a value")
    return choices


def _grid(ctx: _Ctx, decl: ParamDecl, param: Parameter) -> str | tuple[Any, ...] | None:
    grid = decl.grid
    if grid is None:
        return None
    if isinstance(grid, str):
        if grid not in GRID_KEYWORDS:
            raise ctx.error("grid", f"unknown grid {grid!r} (known: {', '.join(GRID_KEYWORDS)})")
        if param.type != ParamType.FLOAT or param.low <= 0:
            raise ctx.error("grid", f"{grid!r} needs a float parameter with low > 0")
        return grid
    if param.type == ParamType.CATEGORICAL:
        values = grid
    else:
        values = tuple(_number(ctx, "grid", v, param.type == ParamType.INT) for v in grid)
    for v in values:
        if not param.contains(v):
            raise ctx.error("grid", f"value {v!r} lies outside the parameter's range/choices")
    if len({repr(v) for v in values}) != len(values):
        raise ctx.error("grid", "must not repeat a value")
    return values


def parse_parameter(
    name: str,
    path: str,
    decl: ParamDecl,
    names: Mapping[str, str],
    field: str,
    source: str | None,
) -> Parameter:
    """Validate a declaration against the rest of its space.

    Args:
        name: The parameter's name as written.
        path: Its config path (``hparams.client_lr``).
        decl: The declaration (merged, if other declarations narrow it).
        names: Every name and path of the space, to its path.
        field: The entry's dotted path, for errors.
        source: The file it comes from (None: the spec).

    Returns:
        The parameter.

    Raises:
        ConfigError: The declaration is inconsistent (bounds, step, default, grid, condition
            or tie); the error names ``{field}.<key>``.
    """
    ctx = _Ctx(field, source)
    common: dict[str, Any] = {"name": name, "path": path}
    common.update(
        enabled=True if decl.enabled is None else decl.enabled,
        description=decl.description or "",
    )
    if decl.when is not None:
        try:
            cond = parse_condition(decl.when, names)
        except ConditionSyntaxError as exc:
            raise ctx.error("when", f"invalid condition: {exc}") from None
        for ref in sorted(cond.names):
            if ref not in names.values():
                known = ", ".join(sorted(n for n in names if "." not in n))
                hint = did_you_mean(ref, [n for n in names if "." not in n])
                raise ctx.error(
                    "when", f"references unknown parameter {ref!r}{hint} (known: {known})"
                )
        common["when"] = cond
    if "tie" in decl.given():
        return _tied(ctx, decl, names, path, common)
    try:
        kind = kind_of(decl.type)
    except ConfigError as exc:  # no type given
        raise ctx.error("type", exc.reason) from None
    if kind == ParamType.CATEGORICAL:
        param = Parameter(type=kind, choices=_choices(ctx, decl), **common)
    else:
        param = Parameter(type=kind, **_bounds(ctx, decl, kind), **common)
    default = decl.default
    if default is not None:
        if kind != ParamType.CATEGORICAL:
            default = _number(ctx, "default", default, kind == ParamType.INT)
        if not param.contains(default):  # with the grid's problem, if any: both at once
            outside = ctx.error(
                "default", f"{default!r} lies outside the parameter's range/choices"
            )
            try:
                _grid(ctx, decl, param)
            except ConfigError as grid_error:
                raise combine_errors([outside, grid_error]) from None
            raise outside
    return dataclasses.replace(param, default=default, grid=_grid(ctx, decl, param))


def _tied(
    ctx: _Ctx, decl: ParamDecl, names: Mapping[str, str], path: str, common: dict
) -> Parameter:
    extra = sorted(set(decl.given()) & DISTRIBUTION_KEYS)
    if extra:
        raise ctx.error(extra[0], "a tied parameter copies its value; it takes no distribution")
    target = decl.tie
    if target not in names:
        known = ", ".join(sorted(n for n in names if "." not in n))
        hint = did_you_mean(target, [n for n in names if "." not in n])
        raise ctx.error("tie", f"unknown parameter {target!r}{hint} (known: {known})")
    if names[target] == path:
        raise ctx.error("tie", "a parameter cannot be tied to itself")
    return Parameter(tie=names[target], **common)
