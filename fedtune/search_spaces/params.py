"""Parse and validate one parameter entry of a space (``parameters.<name>: {...}``).

Every error is ``ConfigError(f"{prefix}.{name}.{key}", reason, source)`` so a message names the
file, the parameter and what is wrong. The rules mirror what Optuna accepts, checked up front
instead of being adjusted silently: ``log`` needs ``low > 0`` and excludes ``step``; a ``step``
must divide ``high − low``; integer ``log`` ranges take no step; categorical choices are
None/bool/int/float/str.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from fedtune.errors import ConfigError, combine_errors
from fedtune.trainers.typed import coerce, error_path

from .conditions import ConditionSyntaxError, parse_condition
from .model import GRID_KEYWORDS, Parameter, ParamType

__all__ = ["PARAM_KEYS", "merge_raw", "parse_parameter"]

PARAM_KEYS = (
    "type",
    "low",
    "high",
    "log",
    "step",
    "choices",
    "default",
    "grid",
    "when",
    "tie",
    "enabled",
    "description",
)
_DISTRIBUTION_KEYS = {"type", "low", "high", "log", "step", "choices", "default", "grid"}
_SCALARS = (type(None), bool, int, float, str)


class _Ctx:
    """Where a parameter entry sits (``search.parameters.client_lr``) and its file."""

    def __init__(self, field: str, source: str | None) -> None:
        self.field = field
        self.source = source

    def error(self, key: str | None, reason: str) -> ConfigError:
        """The error at ``key`` of the entry (the entry itself for None), by the one
        convention for error paths (:func:`fedtune.trainers.typed.error_path`)."""
        return ConfigError(error_path([key or ""], self.field), reason, self.source)

    def typed(self, raw: Mapping[str, Any], key: str, hint: Any, default: Any) -> Any:
        """``raw[key]`` (``default`` when absent) validated against ``hint`` by the engine's
        input rules (:func:`fedtune.trainers.typed.coerce`)."""
        try:
            return coerce(raw.get(key, default), hint, error_path([key], self.field))
        except ConfigError as exc:
            raise ConfigError(exc.field, exc.reason, self.source) from None


def _number(ctx: _Ctx, key: str, value: Any, integer: bool) -> float | int:
    if isinstance(value, str):  # YAML 1.1 reads `1e-3` as a string
        try:
            value = float(value)
        except ValueError:
            raise ctx.error(key, f"must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ctx.error(key, f"must be a finite number, got {value!r}")
    if integer:
        if float(value) != int(value):
            raise ctx.error(key, f"must be an integer for an int parameter, got {value!r}")
        return int(value)
    return float(value)


def _bounds(ctx: _Ctx, raw: Mapping[str, Any], kind: ParamType) -> dict[str, Any]:
    integer = kind == ParamType.INT
    for key in ("low", "high"):
        if key not in raw:
            raise ctx.error(key, f"is required for a {kind} parameter")
    if "choices" in raw:
        raise ctx.error("choices", f"only categorical parameters have choices (this is {kind})")
    low = _number(ctx, "low", raw["low"], integer)
    high = _number(ctx, "high", raw["high"], integer)
    if low > high:
        raise ctx.error("low", f"low ({low}) > high ({high})")
    log = ctx.typed(raw, "log", bool, False)
    if log and low <= 0:
        raise ctx.error("log", f"a log scale needs low > 0, got low = {low}")
    step = raw.get("step")
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


def _choices(ctx: _Ctx, raw: Mapping[str, Any]) -> tuple[Any, ...]:
    for key in ("low", "high", "log", "step"):
        if key in raw:
            raise ctx.error(key, "a categorical parameter has choices, not bounds")
    choices = raw.get("choices")
    if not isinstance(choices, (list, tuple)) or not choices:
        raise ctx.error("choices", "must be a non-empty list")
    for c in choices:
        if not isinstance(c, _SCALARS):
            raise ctx.error("choices", f"must be null, booleans, numbers or strings; got {c!r}")
    if len({repr(c) for c in choices}) != len(choices):
        raise ctx.error("choices", "must not repeat a value")
    return tuple(choices)


def _grid(ctx: _Ctx, raw: Mapping[str, Any], param: Parameter) -> str | tuple[Any, ...] | None:
    grid = raw.get("grid")
    if grid is None:
        return None
    if isinstance(grid, str):
        if grid not in GRID_KEYWORDS:
            raise ctx.error("grid", f"unknown grid {grid!r} (known: {', '.join(GRID_KEYWORDS)})")
        if param.type != ParamType.FLOAT or param.low <= 0:
            raise ctx.error("grid", f"{grid!r} needs a float parameter with low > 0")
        return grid
    if not isinstance(grid, (list, tuple)) or not grid:
        raise ctx.error("grid", "must be a non-empty list or one of " + ", ".join(GRID_KEYWORDS))
    if param.type == ParamType.CATEGORICAL:
        values = tuple(grid)
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
    raw: Mapping[str, Any],
    names: Mapping[str, str],
    field: str,
    source: str | None,
) -> Parameter:
    """Validate ``raw``; ``names`` maps every name/path of the space to its path."""
    ctx = _Ctx(field, source)
    if not isinstance(raw, Mapping):
        raise ctx.error(None, f"must be a mapping of {', '.join(PARAM_KEYS)}")
    unknown = sorted(set(raw) - set(PARAM_KEYS))
    if unknown:
        raise ctx.error(unknown[0], f"unknown key (known: {', '.join(PARAM_KEYS)})")
    common: dict[str, Any] = {"name": name, "path": path}
    common.update(
        enabled=ctx.typed(raw, "enabled", bool, True),
        description=ctx.typed(raw, "description", str, ""),
    )
    if raw.get("when") is not None:
        try:
            cond = parse_condition(raw["when"], names)
        except ConditionSyntaxError as exc:
            raise ctx.error("when", f"invalid condition: {exc}") from None
        for ref in sorted(cond.names):
            if ref not in names.values():
                known = ", ".join(sorted(n for n in names if "." not in n))
                raise ctx.error("when", f"references unknown parameter {ref!r} (known: {known})")
        common["when"] = cond
    if "tie" in raw:
        return _tied(ctx, raw, names, path, common)
    kind = raw.get("type")
    if kind not in tuple(ParamType):
        raise ctx.error("type", f"must be one of float, int, categorical; got {kind!r}")
    kind = ParamType(kind)
    if kind == ParamType.CATEGORICAL:
        param = Parameter(type=kind, choices=_choices(ctx, raw), **common)
    else:
        param = Parameter(type=kind, **_bounds(ctx, raw, kind), **common)
    default = raw.get("default")
    if default is not None:
        if kind != ParamType.CATEGORICAL:
            default = _number(ctx, "default", default, kind == ParamType.INT)
        if not param.contains(default):  # with the grid's problem, if any: both at once
            outside = ctx.error(
                "default", f"{default!r} lies outside the parameter's range/choices"
            )
            try:
                _grid(ctx, raw, param)
            except ConfigError as grid_error:
                raise combine_errors([outside, grid_error]) from None
            raise outside
    return dataclasses.replace(param, default=default, grid=_grid(ctx, raw, param))


def _tied(
    ctx: _Ctx, raw: Mapping[str, Any], names: Mapping[str, str], path: str, common: dict
) -> Parameter:
    extra = sorted(set(raw) & _DISTRIBUTION_KEYS)
    if extra:
        raise ctx.error(extra[0], "a tied parameter copies its value; it takes no distribution")
    target = raw["tie"]
    if not isinstance(target, str) or target not in names:
        known = ", ".join(sorted(n for n in names if "." not in n))
        raise ctx.error("tie", f"unknown parameter {target!r} (known: {known})")
    if names[target] == path:
        raise ctx.error("tie", "a parameter cannot be tied to itself")
    return Parameter(tie=names[target], **common)


def merge_raw(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Field-level override of a parameter entry.

    The override *replaces* the entry when it sets ``tie``, changes ``type``, or gives a
    distribution to a tied entry; otherwise its keys update the base entry (so
    ``{high: 1.0}`` narrows a shipped range and ``{enabled: true}`` switches one on).
    """
    if not isinstance(over, Mapping):
        return over  # type: ignore[return-value]  # reported by parse_parameter
    replace = (
        "tie" in over
        or ("type" in over and over["type"] != base.get("type"))
        or ("tie" in base and bool(set(over) & _DISTRIBUTION_KEYS))
    )
    return dict(over) if replace else {**base, **over}
