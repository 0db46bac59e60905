"""A plain mapping (YAML/JSON) → :class:`~.config.TrialConfig`, against the registries.

Kept apart from :mod:`.config` (the types): parsing reads the algorithm registry and imports user
code, and the registry names the types, so the two directions live in two modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from fedtune.errors import ConfigError, as_mapping
from fedtune.suggest import unknown_key

from .algorithms.registry import get_recipe
from .code import load_code
from .code_spec import parse_code_spec
from .config import DecayConfig, TaskConfig, TrainConfig, TrialConfig
from .typed import from_mapping

__all__ = ["parse_trial_config"]

_MISSING = object()


@dataclass(frozen=True)
class _Document:
    """A trial configuration's top-level keys as given, each read once."""

    task: Any = _MISSING
    algorithm: Any = None
    train: Any = None
    hparams: Any = None
    decay: Any = None
    seed: Any = 0
    code: Any = None


_TOP_KEYS = tuple(f.name for f in fields(_Document))


def parse_trial_config(data: Mapping[str, Any], source: str | None = None) -> TrialConfig:
    """Validate a plain mapping into a :class:`TrialConfig` (errors name the dotted field).

    ``hparams`` are checked against the algorithm's recipe: only the names it accepts, each
    typed and within the bounds its part declares. A ``code`` section is imported first
    (:func:`~fedtune.trainers.code.load_code`; a relative ``path`` is relative to the working
    directory), so that the names it registers validate.
    """
    try:
        data = as_mapping(data, "<root>", what=" (a training configuration)")
        unknown = sorted(set(data) - set(_TOP_KEYS))
        if unknown:
            raise ConfigError(unknown[0], unknown_key(unknown[0], _TOP_KEYS))
        doc = _Document(**data)
        code = None
        if doc.code is not None:
            code = parse_code_spec(doc.code).resolved(".")
            load_code(code)
        if doc.task is _MISSING:
            raise ConfigError("task", "is required")
        if not isinstance(doc.algorithm, str):
            raise ConfigError("algorithm", "is required (an algorithm name, e.g. fedavg)")
        if isinstance(doc.seed, bool) or not isinstance(doc.seed, int):
            raise ConfigError("seed", f"must be an integer, got {doc.seed!r}")
        hparams = get_recipe(doc.algorithm).given_hparams(doc.hparams)
        return TrialConfig(
            task=TaskConfig.from_dict(doc.task),
            algorithm=doc.algorithm,
            train=from_mapping(TrainConfig, doc.train, "train"),
            hparams=hparams,
            decay=from_mapping(DecayConfig, doc.decay, "decay"),
            seed=doc.seed,
            code=code,
        )
    except ConfigError as exc:
        if source and not exc.source:
            raise exc.with_source(source) from None
        raise
