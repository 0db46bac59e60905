"""Plain dicts -> frozen, validated dataclasses, by pydantic (docs/development/style.md habit 3:
typed early).

``from_mapping(cls, data, path)`` builds a frozen dataclass (``TrainConfig``, a task's
parameters) from a mapping: unknown keys are refused, values are validated by pydantic against
the field annotations, and each dataclass may define ``validate(self, path)`` for range checks.
Every error is a :class:`~fedtune.errors.ConfigError` naming the dotted path
(``train.local_steps``, ``hparams.theta[1]``) and the reason. The same rules apply to the
hyperparameters the parts declare (:mod:`fedtune.trainers.hparams`): a boolean is never a
number, an integer is never read from a string, a float may be (YAML 1.1 reads ``1e-3`` as a
string), an integral float is an integer, strings and booleans are strict.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BeforeValidator, ConfigDict, StrictBool, StrictStr, TypeAdapter, create_model
from pydantic import ValidationError as _ValidationError

from fedtune.errors import ConfigError, as_mapping
from fedtune.suggest import unknown_key

T = TypeVar("T")

__all__ = [
    "check",
    "coerce",
    "config_error",
    "error_path",
    "from_mapping",
    "keys_at",
    "number",
    "replace_fields",
    "to_dict",
]


def check(condition: bool, field: str, reason: str) -> None:
    """Raise ``ConfigError(field, reason)`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, reason)


def _number_input(kind: type):
    def refuse(value: Any) -> Any:
        if isinstance(value, bool) or (kind is int and isinstance(value, str)):
            raise ValueError(f"must be {'an integer' if kind is int else 'a number'}")
        return value

    return refuse


def number(kind: type, *constraints: Any) -> Any:
    """``int``/``float`` with fedtune's input rules (see module docstring) and pydantic
    ``constraints`` (e.g. ``Field(ge=0)``)."""
    return Annotated[kind, *constraints, BeforeValidator(_number_input(kind))]


def _strict(hint: Any) -> Any:
    """``hint`` with fedtune's input rules applied to every scalar inside it."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool:
        return StrictBool
    if hint in (int, float):
        return number(hint)
    if hint is str:
        return StrictStr
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_strict(a) for a in args)]  # noqa: UP007
    if origin in (tuple, list):
        item = args[0] if args else Any
        return tuple[_strict(item), ...]
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return dict[str, Any]
    if dataclasses.is_dataclass(hint):
        return _model(hint)
    return hint


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of the dataclass ``cls``, evaluated once per class
    (``typing.get_type_hints`` evaluates every string annotation again on each call; read
    per field, that was the most of building a ``TrainConfig``). Read only, never changed."""
    return typing.get_type_hints(cls)


@functools.cache
def _model(cls: type) -> type:
    """A pydantic model with the (strict-input) fields of the dataclass ``cls``."""
    hints = _hints(cls)
    fields = {f.name: (_strict(hints[f.name]), None) for f in dataclasses.fields(cls) if f.init}
    return create_model(
        f"{cls.__name__}Input", __config__=ConfigDict(extra="forbid", frozen=True), **fields
    )


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Build the frozen dataclass ``cls`` from ``data``; unknown keys are errors."""
    data = {} if data is None else data
    data = as_mapping(data, path or cls.__name__)
    known = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    prefix = f"{path}." if path else ""
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}", unknown_key(unknown[0], known))
    try:
        parsed = _model(cls).model_validate(dict(data))
    except _ValidationError as exc:
        raise config_error(exc, path) from None
    obj = cls(**{k: _value(getattr(parsed, k), cls, k) for k in data})
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate(path)
    return obj


def replace_fields(obj: T, values: Mapping[str, Any], path: str = "") -> T:
    """A copy of the frozen dataclass ``obj`` with ``values`` in its fields, each checked as
    :func:`from_mapping` checks it (unknown keys, the field's type, ``validate``).

    Args:
        obj: The dataclass.
        values: ``{field: value}``.
        path: The dotted path of ``obj`` in errors.

    Returns:
        The new dataclass (``obj`` itself when ``values`` is empty).
    """
    if not values:
        return obj
    cls = type(obj)
    known = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    prefix = f"{path}." if path else ""
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"{prefix}{unknown[0]}", unknown_key(unknown[0], known))
    hints = _hints(cls)
    new = dataclasses.replace(
        obj, **{k: coerce(v, hints[k], f"{prefix}{k}") for k, v in values.items()}
    )
    validate = getattr(new, "validate", None)
    if callable(validate):
        validate(path)
    return new


def _value(value: Any, cls: type, name: str) -> Any:
    """A validated value as the dataclass field holds it (nested dataclasses rebuilt)."""
    hint = _hints(cls)[name]
    if hasattr(value, "model_dump") and dataclasses.is_dataclass(hint):
        return hint(**{k: _value(getattr(value, k), hint, k) for k in value.model_fields_set})
    return value


@functools.cache
def _adapter(hint: Any) -> TypeAdapter:
    return TypeAdapter(_strict(hint))


def coerce(value: Any, hint: Any, path: str) -> Any:
    """``value`` validated against the annotation ``hint`` (``ConfigError`` at ``path``)."""
    try:
        return _adapter(hint).validate_python(value)
    except _ValidationError as exc:
        raise config_error(exc, path) from None


#: pydantic's names of validator layers in an error location (not fields)
_LAYERS = ("function-", "tuple[", "union[")


def error_path(loc: typing.Iterable[Any], path: str = "") -> str:
    """Join a pydantic error location onto ``path`` with fedtune's convention.

    Names are joined with dots and list indices written ``[i]``
    (``search.parameters.client_lr.low``, ``hparams.theta[1]``); pydantic's names of validator
    layers (``function-after[...]``) are skipped.

    Args:
        loc: The location, e.g. ``("train", "rounds")`` or ``("seeds", 1)``.
        path: The dotted path the location is relative to ("" for the root).

    Returns:
        The dotted path ("" when both are empty).
    """
    field = path
    for part in loc:
        if isinstance(part, str) and part.startswith(_LAYERS):
            continue
        if isinstance(part, int):
            field += f"[{part}]"
        elif part != "":
            field += f".{part}" if field else str(part)
    return field


def config_error(
    exc: _ValidationError,
    path: str = "",
    bounds: typing.Callable[[str], str] | None = None,
    model: Any = None,
) -> ConfigError:
    """Turn the first error of a pydantic validation into ``ConfigError(dotted path, reason)``.

    This is fedtune's one convention for the paths of validation errors (:func:`error_path`):
    the engine's configurations, the hyperparameters and the study spec all report through it.
    A ``ConfigError`` raised inside a validator keeps its own field, relative to the location
    it was raised at.

    Args:
        exc: The pydantic error.
        path: The dotted path the validated value sits at ("" for the root).
        bounds: Words a range error from the field's declaration (``in [0, 1)``), by name.
        model: The pydantic model validated: an unknown key's error lists the keys its
            mapping takes and suggests the closest (:func:`fedtune.suggest.unknown_key`).

    Returns:
        The error; its field is ``<root>`` when the location is empty.
    """
    err = exc.errors()[0]
    field = error_path(err["loc"], path)
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, ConfigError):
        return ConfigError(error_path([inner.field], field) or "<root>", inner.reason)
    if err["type"] in _EXTRA and model is not None and err["loc"]:
        known = keys_at(model, err["loc"][:-1])
        if known:
            return ConfigError(field, unknown_key(err["loc"][-1], known))
    return ConfigError(field or "<root>", _reason(err, bounds))


_EXTRA = ("unexpected_keyword_argument", "extra_forbidden")


def keys_at(model: Any, loc: typing.Sequence[Any]) -> list[str]:
    """The keys the mapping at ``loc`` of a pydantic ``model`` takes (its fields' names).

    Args:
        model: The pydantic model class.
        loc: A location inside it, as pydantic errors give it (names, indices, layers).

    Returns:
        The field names, in the model's order; empty when ``loc`` leads to no model.
    """
    hint: Any = model
    for part in loc:
        if isinstance(part, str) and part.startswith(_LAYERS):
            continue
        if isinstance(part, int):
            hint = next((a for a in _members(hint) if typing.get_origin(a) in (list, tuple)), None)
            hint = (typing.get_args(hint) or (None,))[0]
            continue
        cls = next((m for m in _members(hint) if hasattr(m, "model_fields")), None)
        if cls is None:  # a mapping's key: its values' type
            mapping = next((m for m in _members(hint) if typing.get_origin(m) is dict), None)
            hint = (typing.get_args(mapping) or (None, None))[1]
            continue
        field = cls.model_fields.get(part)
        if field is None:
            return []
        hint = field.annotation
    cls = next((m for m in _members(hint) if hasattr(m, "model_fields")), None)
    return [] if cls is None else list(cls.model_fields)


def _members(hint: Any) -> list[Any]:
    """The types a hint may stand for (a union's and an ``Annotated``'s members, flattened)."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        return _members(typing.get_args(hint)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(hint) for m in _members(a)]
    return [hint]


def _reason(err: Mapping[str, Any], bounds: typing.Callable[[str], str] | None) -> str:
    kind, got = err["type"], err.get("input")
    ctx = err.get("ctx") or {}
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        name = next((p for p in err["loc"] if isinstance(p, str)), "")
        if bounds is not None and bounds(name):
            return f"must be {bounds(name)}, got {got!r}"
        return f"{err['msg'].replace('Input should be', 'must be')}, got {got!r}"
    if kind == "value_error":
        return f"{ctx.get('error')}, got {got!r}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}, got {got!r}"
    if kind in _EXTRA:
        return "unknown key"
    if kind == "missing":
        return "is required"
    what = {
        "bool": "true or false",
        "int": "an integer",
        "float": "a number",
        "finite": "a finite number",
        "string": "a string",
        "tuple": "a list",
        "list": "a list",
        "dict": "a mapping",
        "model": "a mapping",
    }.get(kind.split("_", 1)[0])
    return f"must be {what}, got {got!r}" if what else err["msg"]


def to_dict(obj: Any) -> Any:
    """Inverse of :func:`from_mapping` for JSON/YAML output (tuples become lists)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
