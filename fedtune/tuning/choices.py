"""The cheap check of one categorical choice (``StudySpec.validate_deep``).

A whole trial configuration is parsed once, for the parameter's first choice; each other choice
``v`` of ``hparams.<x>``, ``train.<x>`` or ``decay.<x>`` is then checked against that parsed
configuration by the field's declaration alone: a hyperparameter by the declaration of the part
that owns it (the recipe's :meth:`~fedtune.trainers.algorithms.Recipe.given_hparams`, the same
validation as a whole parse); a ``train``/``decay`` field is coerced to its declared type
(``fedtune.trainers.typed``), the section is rebuilt with it and its ``validate`` range checks
run; the result goes to the algorithm's recipe. The cost per
choice is one dataclass rebuild, not a deep copy, a parse of three sections and their type hints
(~0.8 ms per choice). ``task.<x>`` values are not checked per choice at
submission (a task validates its parameters when it is built), exactly as in a whole parse.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

from fedtune.errors import ConfigError
from fedtune.trainers.algorithms.registry import get_recipe
from fedtune.trainers.config import DecayConfig, TrainConfig, TrialConfig
from fedtune.trainers.typed import coerce

__all__ = ["can_check_cheaply", "check_choice"]

_SECTIONS: dict[str, type] = {"train": TrainConfig, "decay": DecayConfig}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    return {k: v for k, v in typing.get_type_hints(cls).items() if k in fields}


def can_check_cheaply(path: str) -> bool:
    """Whether :func:`check_choice` handles ``path`` (else: parse a whole configuration)."""
    section, _, key = path.partition(".")
    if section == "task":
        return key not in ("name", "seed")
    if section == "hparams":
        return True
    return section in _SECTIONS and key in _hints(_SECTIONS[section])


def check_choice(base: TrialConfig, path: str, value: Any) -> TrialConfig:
    """``base`` with ``path`` set to ``value``, checked by the field's declaration (see the
    module docstring); raises ``ConfigError`` naming ``path``."""
    section, _, key = path.partition(".")
    if section == "task":
        params = {**base.task.params, key: value}
        return dataclasses.replace(base, task=dataclasses.replace(base.task, params=params))
    if section == "hparams":
        given = get_recipe(base.algorithm).given_hparams({**base.hparams, key: value})
        return dataclasses.replace(base, hparams=given)
    cls = _SECTIONS.get(section)
    if cls is None or key not in _hints(cls):
        raise ConfigError(path, "is not a field of the trial configuration")
    coerced = coerce(value, _hints(cls)[key], path)
    rebuilt = dataclasses.replace(getattr(base, section), **{key: coerced})
    rebuilt.validate(section)
    return dataclasses.replace(base, **{section: rebuilt})
