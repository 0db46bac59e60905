"""Hyperparameter declarations: every part owns its typed hyperparameters
(docs/explanation/architecture.md §9).

A part (client rule, server optimizer, aggregator, a method's own rule; built in or user code)
declares each hyperparameter it reads once, as an :class:`HParam`: its type, default, validity
bounds and default search-space entry::

    SERVER_MOMENTUM = HParam(
        "server_momentum", float, 0.9, bounds=(0.0, 1.0), open="high",
        space=Space(0.0, 0.99, grid=(0.0, 0.5, 0.9, 0.99)), doc="β, heavy-ball coefficient",
    )

Everything else reads that declaration: a recipe's validated hyperparameters (a frozen dataclass
made by :func:`hparams_type`, validated by pydantic, errors naming ``hparams.<name>``), the
default search space of an algorithm without a shipped one and the bounds check of every
searched range (:mod:`fedtune.search_spaces.declared`), ``fedtune spaces``, the study spec and
so Optuna. Numbers need ``bounds=(low, high)`` (``math.inf`` for no limit; ``open`` makes an
end exclusive); a numeric hyperparameter declared without bounds, a default outside them, or a
search range beyond them is a :class:`~fedtune.errors.CodeError` naming the hyperparameter and
the file:line of the declaration.

Names follow docs/explanation/algorithms.md §0 (client_*/server_* prefixes;
Charles & Konečný 2021 (arXiv:2103.05032) §2.1).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, StrictBool, TypeAdapter
from pydantic import ValidationError as _ValidationError

from fedtune.errors import CodeError

from .plugins import caller_location
from .typed import config_error, number

__all__ = ["HParam", "Space", "hparams_type", "validate_hparams"]

_KINDS = (float, int, bool, str, tuple)
_OPEN = ("", "low", "high", "both")


@dataclass(frozen=True)
class Space:
    """The default search-space entry of one hyperparameter (see :mod:`fedtune.search_spaces`).

    Args:
        low: The range's lower end (numbers).
        high: The range's upper end (numbers).
        log: Sample on a log scale.
        grid: The grid-search values, or a grid keyword of the search spaces (e.g. decades).
        choices: A categorical's values (None: the declared choices).
        default: The value searches start from (None: the declared default).
        enabled: Whether the algorithm's default space searches it.
    """

    low: float | None = None
    high: float | None = None
    log: bool = False
    grid: str | tuple[Any, ...] | None = None
    choices: tuple[Any, ...] | None = None
    default: Any = None
    enabled: bool = True


@dataclass(frozen=True)
class HParam:
    """One hyperparameter, declared once by the part that reads it.

    Args:
        name: Its name, as ``hparams.<name>`` (an identifier).
        type: ``float``, ``int``, ``bool``, ``str`` or ``tuple`` (floats, each within
            ``bounds``).
        default: Its value when a study sets none.
        bounds: ``(low, high)``, required for numbers (``math.inf`` for no limit).
        open: Which ends of ``bounds`` are exclusive: ``""``, ``low``, ``high`` or ``both``.
        choices: The only values a str or int may take.
        nullable: Whether None is a value (a derived default, e.g. ``central_lr``).
        space: Its default search-space entry (None: not searched by default).
        doc: One line for ``fedtune spaces`` and the references.
        declared_at: ``file:line`` of the declaration (default: the caller's).

    Raises:
        CodeError: An invalid declaration: a number without bounds, a default or search range
            outside them, a bad name, type or choice.

    Example:
        ```python
        HParam("damping", float, 0.5, bounds=(0.0, 1.0), open="low",
               space=Space(0.05, 1.0, log=True), doc="server step damping")
        ```
    """

    name: str
    type: type
    default: Any
    bounds: tuple[float, float] | None = None
    open: Literal["", "low", "high", "both"] = ""
    choices: tuple[Any, ...] | None = None
    nullable: bool = False
    space: Space | None = None
    doc: str = ""
    declared_at: str = dataclasses.field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.declared_at:
            object.__setattr__(self, "declared_at", caller_location())
        problem = self._declaration_problem()
        if problem:
            raise CodeError(f"hparams.{self.name}", problem, self.declared_at)

    # -- declaration checks ------------------------------------------------------------
    def _declaration_problem(self) -> str:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            return f"hyperparameter name must be an identifier, got {self.name!r}"
        if self.type not in _KINDS:
            return f"{self.name}: type must be float, int, bool, str or tuple, got {self.type!r}"
        if self.open not in _OPEN:
            return f"{self.name}: open must be one of {', '.join(map(repr, _OPEN))}"
        if self.numeric and self.choices is None:
            problem = self._bounds_problem()
            if problem:
                return problem
        if self.choices is not None and not (isinstance(self.choices, tuple) and self.choices):
            return f"{self.name}: choices must be a non-empty tuple"
        bad_default = not (self.nullable and self.default is None) and self.value_problem(
            self.default
        )
        if bad_default:
            return f"{self.name}: default {self.default!r} {bad_default}"
        return self._space_problem()

    def _bounds_problem(self) -> str:
        b = self.bounds
        if b is None:
            return (
                f"hyperparameter {self.name!r} is declared without bounds: give "
                "bounds=(low, high) (math.inf for no upper limit)"
            )
        ok = (
            isinstance(b, tuple)
            and len(b) == 2
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in b)
            and not any(math.isnan(v) for v in b)
            and b[0] <= b[1]
        )
        return "" if ok else f"{self.name}: bounds must be (low, high) with low <= high, got {b!r}"

    def _space_problem(self) -> str:
        s = self.space
        if s is None:
            return ""
        if self.type in (bool, tuple):
            return f"{self.name}: a {self.type.__name__} hyperparameter has no search space"
        if self.choices is not None or self.type is str:
            bad = [c for c in (s.choices or ()) if self.value_problem(c)]
            return f"{self.name}: space choice {bad[0]!r} is not a valid value" if bad else ""
        if s.low is None or s.high is None:
            return f"{self.name}: a numeric search space needs low and high"
        for v in (s.low, s.high, *(s.grid if isinstance(s.grid, tuple) else ())):
            if self.value_problem(v):
                return f"{self.name}: search value {v!r} {self.value_problem(v)}"
        return ""

    # -- values ------------------------------------------------------------------------
    @property
    def numeric(self) -> bool:
        return self.type in (float, int, tuple)

    def bounds_text(self) -> str:
        """``>= 0``, ``> 0`` or ``in [0, 1)``."""
        lo, hi = self.bounds
        lo_open, hi_open = self.open in ("low", "both"), self.open in ("high", "both")
        if math.isinf(hi) and math.isinf(lo):
            return "a finite number"
        if math.isinf(hi):
            return f"{'>' if lo_open else '>='} {_num(lo)}"
        if math.isinf(lo):
            return f"{'<' if hi_open else '<='} {_num(hi)}"
        return f"in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}{')' if hi_open else ']'}"

    def value_problem(self, value: Any) -> str:
        """Why ``value`` is not valid for this hyperparameter ("" when it is)."""
        validator = self.__dict__.get("_validator")
        if validator is None:
            validator = TypeAdapter(self.annotation())
            object.__setattr__(self, "_validator", validator)
        try:
            validator.validate_python(value)
        except _ValidationError as exc:
            return config_error(exc, self.name, lambda _: self.bounds_text()).reason
        return ""

    def annotation(self) -> Any:
        """The pydantic-annotated type of this hyperparameter."""
        if self.choices is not None:
            kind = Annotated[Literal[self.choices], BeforeValidator(_exact(self.type))]
        elif self.type is bool:
            kind = StrictBool
        elif self.type is str:
            kind = Annotated[str, Field(strict=True)]
        elif self.type is tuple:
            kind = Annotated[tuple[self._number(float), ...], AfterValidator(_some_positive)]
        else:
            kind = self._number(self.type)
        return kind | None if self.nullable else kind

    def _number(self, kind: type) -> Any:
        lo, hi = self.bounds
        lo_key = "gt" if self.open in ("low", "both") else "ge"
        hi_key = "lt" if self.open in ("high", "both") else "le"
        limits = {k: v for k, v in ((lo_key, lo), (hi_key, hi)) if not math.isinf(v)}
        return number(kind, Field(allow_inf_nan=False, **limits))


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def _exact(kind: type):
    def check(value: Any) -> Any:
        if isinstance(value, bool) and kind is not bool:
            raise ValueError("must be one of the choices, not a boolean")
        return value

    return check


def _some_positive(values: tuple[float, ...]) -> tuple[float, ...]:
    if values and not any(v > 0 for v in values):
        raise ValueError("needs a positive weight")
    return values


# -- validated types ---------------------------------------------------------------------


def hparams_type(name: str, declared: Sequence[HParam], defaults: Mapping[str, Any] = {}) -> type:
    """A frozen dataclass with one field per declaration (default: ``defaults`` or the
    declared one); pydantic validates it (see :func:`validate_hparams`)."""
    fields = [
        (h.name, h.annotation(), dataclasses.field(default=defaults.get(h.name, h.default)))
        for h in declared
    ]
    ns = {
        "__pydantic_config__": ConfigDict(extra="forbid"),
        "declared": {h.name: h for h in declared},
    }
    return dataclasses.make_dataclass(name, fields, frozen=True, namespace=ns)


def validate_hparams(cls: type, values: Mapping[str, Any], path: str = "hparams") -> Any:
    """Validate ``values`` into ``cls`` (made by :func:`hparams_type`); the first error becomes
    a ``ConfigError`` naming ``path.<name>`` (``[i]`` for an item of a list)."""
    if "_validator" not in cls.__dict__:
        cls._validator = TypeAdapter(cls)
    try:
        return cls._validator.validate_python(dict(values))
    except _ValidationError as exc:
        raise config_error(exc, path, lambda name: _bounds_text(cls, name)) from None


def _bounds_text(cls: type, name: str) -> str:
    declared = cls.declared.get(name)
    return "" if declared is None or declared.bounds is None else declared.bounds_text()


def merge_declarations(*groups: Iterable[HParam]) -> tuple[HParam, ...]:
    """Concatenate declaration groups; a name declared twice differently is a ``CodeError``."""
    out: dict[str, HParam] = {}
    for h in (h for g in groups for h in g):
        if h.name in out and out[h.name] != h:
            raise CodeError(
                f"hparams.{h.name}",
                f"declared twice (also at {out[h.name].declared_at})",
                h.declared_at,
            )
        out[h.name] = h
    return tuple(out.values())
