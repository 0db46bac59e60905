"""Typed search-space objects: :class:`Parameter` and :class:`SearchSpace` (frozen values).

A parameter's *name* is what the space file writes (``client_lr`` or ``hparams.client_lr``); its
*path* is the trial-configuration field it sets (``hparams.client_lr``), see :func:`resolve_path`.
Conditions and ties refer to other parameters by name or path and are stored resolved to paths.

Grids (for grid search) follow the papers' protocol: ``grid: half-decade`` is
{10^(k/2)} ∩ [low, high] — for [10⁻³, 10¹] exactly {10⁻³, 10^−2.5, …, 10¹}, the client/server
learning-rate grid of Charles & Konečný 2020 (arXiv:2007.00878) §8.3 and
Charles & Konečný 2021 (arXiv:2103.05032) Fig. 6; ``grid: decade`` is {10^k} ∩ [low, high]; an
explicit list is taken as written.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from fedtune.trainers.config import DecayConfig, TrainConfig

from .conditions import Condition

__all__ = ["GRID_KEYWORDS", "ParamType", "Parameter", "SearchSpace", "resolve_path"]

#: named grids: keyword -> points per decade
GRID_KEYWORDS = {"decade": 1, "half-decade": 2}
_SECTIONS = ("hparams", "train", "decay", "task")
_MAX_AUTO_GRID = 64  # an int/stepped range with more points has no implicit grid


class ParamType(enum.StrEnum):
    FLOAT = "float"
    INT = "int"
    CATEGORICAL = "categorical"


def resolve_path(name: str) -> str | None:
    """Config path of a parameter name; None when a dotted name is not a valid path.

    Short names: a field of ``TrainConfig`` -> ``train.<name>``, of ``DecayConfig`` ->
    ``decay.<name>``, anything else -> ``hparams.<name>`` (algorithms add their own hyperparameters).
    Dotted names must be ``hparams.<x>``, ``train.<TrainConfig field>``, ``decay.<DecayConfig
    field>`` or ``task.<x>``.
    """
    train = {f.name for f in dataclasses.fields(TrainConfig)}
    decay = {f.name for f in dataclasses.fields(DecayConfig)}
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        return None
    if len(parts) == 1:
        section = "train" if name in train else "decay" if name in decay else "hparams"
        return f"{section}.{name}"
    if len(parts) != 2 or parts[0] not in _SECTIONS:
        return None
    if (parts[0] == "train" and parts[1] not in train) or (
        parts[0] == "decay" and parts[1] not in decay
    ):
        return None
    return name


@dataclass(frozen=True)
class Parameter:
    """One searched value. ``tie`` (a path) copies another parameter's value instead."""

    name: str
    path: str
    type: ParamType | None = None  # None only for a tied parameter
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Any, ...] | None = None
    default: Any = None
    grid: str | tuple[Any, ...] | None = None
    when: Condition | None = None
    tie: str | None = None
    enabled: bool = True
    description: str = ""

    @property
    def tied(self) -> bool:
        return self.tie is not None

    @property
    def depends_on(self) -> frozenset[str]:
        """Paths this parameter's activity or value depends on."""
        deps = set(self.when.names) if self.when else set()
        if self.tie:
            deps.add(self.tie)
        return frozenset(deps)

    def initial(self) -> Any:
        """The default, or a central value: geometric/arithmetic midpoint, first choice."""
        if self.default is not None or self.tied:
            return self.default
        if self.type == ParamType.CATEGORICAL:
            return self.choices[0]
        lo, hi = float(self.low), float(self.high)
        mid = math.sqrt(lo * hi) if self.log else (lo + hi) / 2
        if self.step:
            mid = lo + round((mid - lo) / self.step) * self.step
        return round(mid) if self.type == ParamType.INT else mid

    def contains(self, value: Any) -> bool:
        if self.type == ParamType.CATEGORICAL:
            return value in self.choices
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if self.type == ParamType.INT and float(value) != int(value):
            return False
        return self.low <= value <= self.high

    def grid_values(self) -> tuple[Any, ...] | None:
        """The grid-search values, or None when the parameter has no finite grid."""
        if self.type == ParamType.CATEGORICAL:
            return tuple(self.grid) if isinstance(self.grid, tuple) else self.choices
        if isinstance(self.grid, tuple):
            return self.grid
        if isinstance(self.grid, str):
            return _decade_grid(float(self.low), float(self.high), GRID_KEYWORDS[self.grid])
        step = self.step or (1 if self.type == ParamType.INT else None)
        if step is None:
            return None
        count = round((self.high - self.low) / step) + 1
        if count > _MAX_AUTO_GRID:
            return None
        values = [self.low + i * step for i in range(count)]
        return tuple(int(v) if self.type == ParamType.INT else float(v) for v in values)

    def to_dict(self) -> dict[str, Any]:
        """The parameter as a space file writes it (round-trips through the loader)."""
        if self.tied:
            out: dict[str, Any] = {"tie": self.tie}
        else:
            out = {"type": str(self.type)}
            if self.type == ParamType.CATEGORICAL:
                out["choices"] = list(self.choices)
            else:
                out.update(low=self.low, high=self.high, log=self.log)
                if self.step is not None:
                    out["step"] = self.step
            if self.default is not None:
                out["default"] = self.default
            if self.grid is not None:
                out["grid"] = self.grid if isinstance(self.grid, str) else list(self.grid)
        if self.when is not None:
            out["when"] = self.when.text
        if not self.enabled:
            out["enabled"] = False
        if self.description:
            out["description"] = self.description
        return out


def _decade_grid(low: float, high: float, per_decade: int) -> tuple[float, ...]:
    k_lo = math.ceil(per_decade * math.log10(low) - 1e-9)
    k_hi = math.floor(per_decade * math.log10(high) + 1e-9)
    return tuple(float(10 ** (k / per_decade)) for k in range(k_lo, k_hi + 1))


@dataclass(frozen=True)
class SearchSpace:
    """Parameters in dependency order (a parameter comes after those it depends on)."""

    name: str
    parameters: tuple[Parameter, ...]
    description: str = ""
    algorithms: tuple[str, ...] = ()
    source: str | None = None

    def __contains__(self, name_or_path: object) -> bool:
        return isinstance(name_or_path, str) and self.find(name_or_path) is not None

    def find(self, name_or_path: str) -> Parameter | None:
        path = resolve_path(name_or_path) if "." not in name_or_path else name_or_path
        return next((p for p in self.parameters if p.path == path), None)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(p.path for p in self.parameters)

    @property
    def enabled(self) -> tuple[Parameter, ...]:
        return tuple(p for p in self.parameters if p.enabled)

    @property
    def drawn(self) -> tuple[Parameter, ...]:
        """The enabled parameters a sampler draws: not tied to another (a tied one copies)."""
        return tuple(p for p in self.enabled if not p.tied)

    def to_dict(self) -> dict[str, Any]:
        """JSON/YAML-ready form (stored with a study; reloadable with ``parse_space``)."""
        return {
            "name": self.name,
            "description": self.description,
            "algorithms": list(self.algorithms),
            "parameters": {p.name: p.to_dict() for p in self.parameters},
        }

    def fingerprint(self) -> str:
        """Hash of what is searched (paths, distributions, conditions, ties, grids, enabled).

        Names, descriptions and the space's own name do not enter, so renaming a file or
        rewording a description keeps a resumed study compatible.
        """
        body = {}
        for p in self.parameters:
            d = p.to_dict()
            d.pop("description", None)
            body[p.path] = d
        text = json.dumps(body, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]
