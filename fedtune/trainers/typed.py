"""Plain dicts -> frozen, validated dataclasses (STYLE.md habit 3: typed early).

``from_mapping(cls, data, path)`` builds a frozen dataclass from a mapping, rejecting unknown
keys and values of the wrong type with a :class:`~fedtune.errors.ConfigError` that names the
dotted path (``train.local_steps``) and the reason. Each dataclass may define
``validate(self, path)`` for range checks.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from fedtune.errors import ConfigError

T = TypeVar("T")

__all__ = ["check", "from_mapping", "to_dict"]


def check(condition: bool, field: str, reason: str) -> None:
    """Raise ``ConfigError(field, reason)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, reason)


def _coerce(value: Any, hint: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError as exc:
                errors.append(exc.reason)
        raise ConfigError(path, "; ".join(errors) or f"invalid value {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(path, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(path, f"must be a list, got {type(value).__name__}")
        item = args[0] if args else Any
        return tuple(_coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or hint is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(path, f"must be a mapping, got {type(value).__name__}")
        return dict(value)
    if dataclasses.is_dataclass(hint):
        if isinstance(value, hint):
            return value
        return from_mapping(hint, value, path)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(path, f"must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(path, f"must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):
                try:
                    return float(value)
                except ValueError:
                    pass
            raise ConfigError(path, f"must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(path, f"must be a string, got {value!r}")
        return value
    return value


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Build the frozen dataclass ``cls`` from ``data``; unknown keys are errors."""
    data = {} if data is None else data
    if not isinstance(data, Mapping):
        raise ConfigError(path or cls.__name__, f"must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{prefix}{unknown[0]}", f"unknown key (known: {', '.join(sorted(fields))})"
        )
    kwargs = {k: _coerce(v, hints[k], f"{prefix}{k}") for k, v in data.items()}
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate(path)
    return obj


def to_dict(obj: Any) -> Any:
    """Inverse of :func:`from_mapping` for JSON/YAML output (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
