"""How the API's answers (:mod:`fedtune.wire_models`, :mod:`fedtune.results`) go to and come
from JSON: their base class :class:`WireModel`, and strict JSON for the values they carry.

An answer is a frozen dataclass deriving from :class:`WireModel`. The SDK builds it from the
decoded JSON (:meth:`WireModel.from_json`: states become enums, times ``datetime``, nested
objects their classes, and keys this version does not know are kept, never dropped); the
service builds it from a database row (:meth:`WireModel.from_attributes`) and FastAPI serialises
it. :func:`described` gives a field the description its OpenAPI schema carries;
:func:`finite_or_none` turns the non-finite floats JSON cannot hold into ``null``.

Pure Python: this module imports neither pydantic nor any server module.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, TypeVar

__all__ = ["WireModel", "described", "finite_or_none"]

W = TypeVar("W", bound="WireModel")


def described(text: str, default: Any = dataclasses.MISSING) -> Any:
    """A field whose OpenAPI schema carries ``text`` as its description."""
    return field(default=default, metadata={"description": text})


class WireModel:
    """Base of the answers: built from JSON (the SDK) or a database row (the service)."""

    __slots__ = ()

    @property
    def extra(self) -> dict[str, Any]:
        """Fields of the answer this version does not know (a newer service's), as sent."""
        return self.__dict__.get("_extra", {})

    def __getitem__(self, key: str) -> Any:
        """``answer["name"]``: a field, or a field this version does not know, by name (code
        written when the SDK answered these as dicts keeps working).

        Raises:
            KeyError: No such field.
        """
        if key in {f.name for f in dataclasses.fields(self)}:  # type: ignore[arg-type]
            return getattr(self, key)
        if key in self.extra:
            return self.extra[key]
        raise KeyError(key)

    @classmethod
    def from_json(cls: type[W], data: Mapping[str, Any]) -> W:
        """Build an answer from its decoded JSON object.

        States become enums, times ``datetime``, nested objects their classes; keys this
        version does not know are kept in :attr:`extra`, never dropped.

        Args:
            data: the decoded JSON object.

        Returns:
            The answer.
        """
        decoders = _decoders(cls)
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in data.items():
            if key in decoders:
                decode = decoders[key]
                known[key] = value if decode is None or value is None else decode(value)
            else:
                extra[key] = value
        answer = cls(**known)
        if extra:
            object.__setattr__(answer, "_extra", extra)  # frozen: not a field, not on the wire
        return answer

    def to_json(self) -> dict[str, Any]:
        """This answer as a JSON-ready object, :attr:`extra` included.

        Returns:
            Its fields (states as strings, times in ISO 8601) and the unknown ones it came with.
        """
        names = [f.name for f in dataclasses.fields(self)]  # type: ignore[arg-type]
        return {name: _encode(getattr(self, name)) for name in names} | self.extra

    @classmethod
    def from_attributes(cls: type[W], obj: Any, **changes: Any) -> W:
        """Build an answer from the same-named attributes of ``obj`` (a database row).

        Args:
            obj: any object with an attribute per field of this class (and its bases).
            **changes: values that replace or complete those attributes.

        Returns:
            The answer.
        """
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        values = {name: getattr(obj, name) for name in names if name not in changes}
        return cls(**values, **changes)


def _encode(value: Any) -> Any:
    if isinstance(value, WireModel):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return value


_DECODERS: dict[type, dict[str, Callable[[Any], Any] | None]] = {}


def _decoders(cls: type) -> dict[str, Callable[[Any], Any] | None]:
    """Field name → how its JSON value becomes the field's type (None: as decoded)."""
    found = _DECODERS.get(cls)
    if found is None:
        hints = typing.get_type_hints(cls)
        found = {f.name: _decoder(hints[f.name]) for f in dataclasses.fields(cls)}
        _DECODERS[cls] = found
    return found


def _decoder(hint: Any) -> Callable[[Any], Any] | None:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _decoder(inner[0]) if len(inner) == 1 else None  # None is passed as is
    if origin is list and args:
        item = _decoder(args[0])
        return None if item is None else (lambda v: [None if x is None else item(x) for x in v])
    if inspect.isclass(hint):
        if issubclass(hint, WireModel):
            return hint.from_json
        if issubclass(hint, enum.Enum):
            return hint
        if issubclass(hint, dt.datetime):
            return dt.datetime.fromisoformat
    return None


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float (inside dicts, lists and tuples) replaced by None.

    Args:
        obj: JSON-like data.

    Returns:
        The same data, valid strict JSON (tuples as lists).
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj
