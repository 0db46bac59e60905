"""What the service accepts as a study spec (the one place it touches ``StudySpec``).

``StudySpec.from_dict`` (``fedtune/tuning/spec.py``) validates the study; the service adds the
rules of a multi-user server on top, each reported as ``ConfigError(field, reason)`` (→ 422):

* ``search.space`` entries must be *shipped* space names: a request must not make the server read
  files of its own file system (inline a space with ``search.parameters`` instead);
* ``tracking.uri`` is refused: the tracking server is the service's setting
  (``MLFLOW_TRACKING_URI``), so a request cannot point drivers at another host or a local path.

The stored document is the spec's normalised ``to_dict()`` (defaults filled in), so a study
resumed by a later version runs with the defaults it was submitted with.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedtune.errors import ConfigError

from .errors import InvalidRequestError

__all__ = ["AcceptedSpec", "accept_spec", "load_spec", "request_hash", "service_rules"]

#: largest budget one submission may ask for (a typo such as 10**9 trials is refused)
MAX_TRIALS = 100_000


@dataclass(frozen=True)
class AcceptedSpec:
    name: str
    algorithm: str
    task: str
    trials: int
    max_concurrent: int
    cpu: float
    gpu: float
    experiment: str
    document: dict[str, Any]


def service_rules(data: Mapping[str, Any]) -> None:
    search = data.get("search")
    if isinstance(search, Mapping):
        spaces = search.get("space")
        spaces = [spaces] if isinstance(spaces, str) else spaces
        for i, name in enumerate(spaces if isinstance(spaces, list) else []):
            if not isinstance(name, str) or "/" in name or name.endswith((".yaml", ".yml")):
                field = "search.space" if len(spaces) == 1 else f"search.space[{i}]"
                raise ConfigError(
                    field,
                    "the service accepts shipped space names only; "
                    "inline a space with search.parameters",
                )
    tracking = data.get("tracking")
    if isinstance(tracking, Mapping) and tracking.get("uri") is not None:
        raise ConfigError(
            "tracking.uri", "is set by the service (MLFLOW_TRACKING_URI); remove it from the spec"
        )


def accept_spec(data: Any) -> AcceptedSpec:
    """Validate a submitted spec; raise ``ConfigError`` with the dotted field path."""
    from fedtune.tuning.spec import StudySpec

    if not isinstance(data, Mapping):
        raise InvalidRequestError("<body>", "the study spec must be a JSON object")
    service_rules(data)
    spec = StudySpec.from_dict(dict(data))
    document = spec.to_dict()
    bad = _non_finite(document)
    if bad is not None:
        raise ConfigError(bad, "must be a finite number (JSON has no NaN or Infinity)")
    if spec.budget.trials > MAX_TRIALS:
        raise ConfigError("budget.trials", f"must be at most {MAX_TRIALS}")
    return AcceptedSpec(
        name=spec.name,
        algorithm=spec.algorithm,
        task=str(spec.task.get("name", "")),
        trials=spec.budget.trials,
        max_concurrent=spec.budget.max_concurrent,
        cpu=float(spec.resources.cpu),
        gpu=float(spec.resources.gpu),
        experiment=spec.experiment,
        document=document,
    )


def _non_finite(value: Any, path: str = "") -> str | None:
    """Dotted path of the first NaN/±∞ inside ``value``, if any."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "<root>"
    items = value.items() if isinstance(value, Mapping) else None
    if items is None and isinstance(value, list):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    for key, item in items or ():
        sub = f"{path}{key}" if str(key).startswith("[") else f"{path}.{key}" if path else str(key)
        found = _non_finite(item, sub)
        if found is not None:
            return found
    return None


def load_spec(document: Mapping[str, Any]) -> Any:
    """The ``StudySpec`` of a stored study (what the driver runs)."""
    from fedtune.tuning.spec import StudySpec

    return StudySpec.from_dict(dict(document))


def request_hash(body: Any) -> str:
    """SHA-256 of the canonical JSON of a request body (idempotency-key reuse check)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()
