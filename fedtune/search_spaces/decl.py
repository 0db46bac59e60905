"""One parameter entry of a space as written (``parameters.<name>: {...}``), typed: ParamDecl.

A declaration holds the keys its author gave, each checked for its kind of value (a number,
true or false, a string, a list of scalars); what depends on the other keys (``low`` below
``high``, a ``step`` that divides the range, a default inside it) is checked when the space
is parsed (:func:`fedtune.search_spaces.params.parse_parameter`), after declarations merge.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    SerializerFunctionWrapHandler,
    StrictBool,
    StrictStr,
    ValidationError,
    WithJsonSchema,
    model_serializer,
)

from fedtune.errors import ConfigError, as_mapping
from fedtune.suggest import unknown_key
from fedtune.trainers.typed import config_error

from .model import Parameter, ParamType

__all__ = ["DISTRIBUTION_KEYS", "PARAM_KEYS", "ParamDecl", "kind_of", "number_of"]

_SCALARS = (type(None), bool, int, float, str)


def number_of(value: Any) -> float | int:
    """Read a finite number as a space declares one.

    Args:
        value: A number, or a string such as ``"1e-3"`` (YAML 1.1 reads that as one).

    Returns:
        The number (an int stays an int).

    Raises:
        ConfigError: (field ``""``) ``value`` is not a finite number.
    """
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ConfigError("", f"must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError("", f"must be a finite number, got {value!r}")
    return value


def kind_of(value: Any) -> ParamType:
    """Read a parameter's ``type``.

    Args:
        value: ``float``, ``int`` or ``categorical``.

    Returns:
        The type.

    Raises:
        ConfigError: (field ``""``) ``value`` is none of them.
    """
    if value not in tuple(ParamType):
        raise ConfigError("", f"must be one of float, int, categorical; got {value!r}")
    return ParamType(value)


def _scalar(value: Any) -> Any:
    if not isinstance(value, _SCALARS):
        raise ConfigError("", f"must be null, a boolean, a number or a string; got {value!r}")
    return value


def _grid(value: Any) -> str | tuple[Any, ...]:
    if isinstance(value, str):
        return value
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError("", "must be a non-empty list or a grid's name")
    return tuple(_scalar(v) for v in value)


#: ``float``, ``int`` or ``categorical``
Kind = Annotated[ParamType, BeforeValidator(kind_of)]
_SCALAR_SCHEMA = {"anyOf": [{"type": t} for t in ("null", "boolean", "number", "string")]}
#: a finite number (a string such as ``"1e-3"``, as YAML 1.1 reads it, is read as one)
Number = Annotated[
    Any,
    AfterValidator(number_of),
    WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "string"}]}),
]
#: null, a boolean, a number or a string (a categorical choice, a default)
Scalar = Annotated[Any, AfterValidator(_scalar), WithJsonSchema(_SCALAR_SCHEMA)]
#: a grid's name (``decade``, ``half-decade``) or the values to try
Grid = Annotated[
    Any,
    AfterValidator(_grid),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": _SCALAR_SCHEMA}]}),
]


class ParamDecl(BaseModel):
    """A searched parameter as declared: a distribution, or a tie to another parameter.

    A declaration keeps only the keys written, so one can narrow another: an override's
    ``{high: 1.0}`` changes the upper bound of the shipped entry and keeps the rest.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Kind | None = None  # float, int or categorical (required unless tie is given)
    low: Number | None = None  # lower bound (float and int)
    high: Number | None = None  # upper bound (float and int)
    log: StrictBool | None = None  # sample on a log scale (needs low > 0); default false
    step: Number | None = None  # a grid step that divides high - low (not with log)
    choices: tuple[Scalar, ...] | None = None  # the values of a categorical parameter
    default: Scalar = None  # the first trial's value (inside the range or choices)
    grid: Grid | None = None  # the grid strategies' values: a list, or decade / half-decade
    when: StrictStr | None = None  # searched only while this condition on others holds
    tie: StrictStr | None = None  # copy another parameter's value instead of searching
    enabled: StrictBool | None = None  # false keeps the entry but fixes it; default true
    description: StrictStr | None = None  # shown by fedtune spaces

    @classmethod
    def read(cls, raw: Any, field: str, source: str | None = None) -> ParamDecl:
        """Read a declaration from plain data (a space file's entry, a spec's).

        Args:
            raw: The entry.
            field: Its dotted path, for errors (``parameters.client_lr``).
            source: The file it comes from (None: the spec).

        Returns:
            The declaration (``raw`` itself when it already is one).

        Raises:
            ConfigError: ``raw`` is not a mapping, has an unknown key or a value of the
                wrong kind; the error names ``{field}.<key>``.
        """
        if isinstance(raw, ParamDecl):
            return raw
        raw = as_mapping(raw, field, source, what=f" of {', '.join(PARAM_KEYS)}")
        unknown = sorted(set(raw) - set(PARAM_KEYS))
        if unknown:
            raise ConfigError(f"{field}.{unknown[0]}", unknown_key(unknown[0], PARAM_KEYS), source)
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            error = config_error(exc, field)
            raise ConfigError(error.field, error.reason, source) from None

    @classmethod
    def of(cls, param: Parameter) -> ParamDecl:
        """Give the declaration of a parsed parameter.

        Args:
            param: The parameter.

        Returns:
            The declaration that parses back to ``param`` (:meth:`Parameter.to_dict`, typed).
        """
        return cls.model_validate(param.to_dict())

    def given(self) -> tuple[str, ...]:
        """Name the keys the declaration gives, in the schema's order.

        Returns:
            The keys (a key given as null counts: ``default: null`` removes a default).
        """
        return tuple(k for k in PARAM_KEYS if k in self.model_fields_set)

    def update(self, over: ParamDecl) -> ParamDecl:
        """This declaration narrowed by ``over``, field by field.

        ``over`` replaces this one instead when it sets ``tie``, changes ``type``, or gives a
        distribution to a tied declaration; otherwise its keys replace these (so ``{high:
        1.0}`` narrows a shipped range and ``{enabled: true}`` switches one on).

        Args:
            over: The overriding declaration.

        Returns:
            The merged declaration.
        """
        keys = over.given()
        if (
            "tie" in keys
            or ("type" in keys and over.type != self.type)
            or ("tie" in self.given() and bool(set(keys) & DISTRIBUTION_KEYS))
        ):
            return over
        return self.model_copy(update={k: getattr(over, k) for k in keys})

    @model_serializer(mode="wrap")
    def _given_only(self, write: SerializerFunctionWrapHandler) -> dict[str, Any]:
        written = write(self)
        return {k: written[k] for k in self.given()}


#: the keys of a declaration, in the order files write them
PARAM_KEYS = tuple(ParamDecl.model_fields)
#: the keys that describe a distribution (a tied parameter takes none of them)
DISTRIBUTION_KEYS = frozenset({"type", "low", "high", "log", "step", "choices", "default", "grid"})
