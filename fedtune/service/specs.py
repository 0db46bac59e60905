"""What the service accepts as a study spec (the one place it touches ``StudySpec``).

``StudySpec`` (``fedtune/tuning/spec/``) validates the study in two steps: ``parse`` checks its
shape into typed sections (cheap), ``check`` validates it in depth (the search space, the recipe,
a trial configuration per bound). Between the two the service applies the rules of a multi-user
server to the parsed spec, each reported as ``ConfigError(field, reason)`` (→ 422):

* ``search.space`` entries must be *shipped* space names and task data paths must lie under the
  operator's data roots: a request must not make the server read files of its own file system;
* sizes (rounds, clients, dim, concurrency, resources, choices per searched parameter) are
  bounded by settings (:mod:`.spec_limits`);
* ``tracking.uri`` is refused: the tracking server is the service's setting
  (``MLFLOW_TRACKING_URI``), so a request cannot point drivers at another host or a local path.

The stored document is the spec's normalised ``to_dict()`` (defaults filled in), so a study
resumed by a later version runs with the defaults it was submitted with.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fedtune.errors import ConfigError, as_mapping

from .errors import InvalidRequestError
from .spec_limits import check_data_paths, check_sizes, check_spaces

if TYPE_CHECKING:
    from fedtune.tuning.spec import StoredSpec, StudySpec

    from .settings import Settings

__all__ = [
    "AcceptedSpec",
    "accept_spec",
    "accepted_from",
    "load_spec",
    "parse_spec",
    "request_hash",
    "service_rules",
    "stored_spec",
    "stored_spec_of",
]

#: parsed stored specs kept by :func:`stored_spec_of` (the fair-share window's rows, and more)
STORED_SPECS_KEPT = 4096


@dataclass(frozen=True)
class AcceptedSpec:
    """A validated study: its summary fields and the normalised document stored.

    ``max_concurrent`` counts configurations at once; ``cpu`` and ``gpu`` are per trial
    process, which trains ``pack`` configurations (an integer, or ``"auto"``): what the study
    reserves is :func:`.project_usage.reservation` of ``document``.
    """

    name: str
    algorithm: str
    task: str
    trials: int | None
    max_concurrent: int
    cpu: float
    gpu: float
    experiment: str
    document: dict[str, Any]
    project: str | None = None
    priority: int = 0
    pack: int | str = 1


def stored_spec(document: Mapping[str, Any] | None) -> StoredSpec:
    """The typed parts of a stored spec that the service reads after acceptance.

    Args:
        document: A study row's spec (None: an empty one).

    Returns:
        Its ``budget``, ``resources`` and ``objective``
        (:class:`fedtune.tuning.spec.StoredSpec`); a row reads it once, as ``Study.sections``.
    """
    from fedtune.tuning.spec import StoredSpec

    return StoredSpec.model_validate(document or {})


_stored: OrderedDict[Hashable, StoredSpec] = OrderedDict()
_stored_lock = threading.Lock()


def stored_spec_of(key: Hashable, document: Mapping[str, Any] | None) -> StoredSpec:
    """:func:`stored_spec` of a study row, parsed once per study rather than once per read.

    A study's spec never changes after it is accepted, so the parsed parts are kept, by the
    row's identity, for the last :data:`STORED_SPECS_KEPT` studies read: the scheduler's tick
    reads the fair-share window's rows again every tick.

    Args:
        key: The row's identity, ``(study id, created_at)``: an id alone may come back in
            another database of the same process (tests reuse fixed ids).
        document: The row's spec, parsed when the key is not kept.

    Returns:
        The typed parts, as :func:`stored_spec` gives them.
    """
    with _stored_lock:
        spec = _stored.get(key)
        if spec is not None:
            _stored.move_to_end(key)
            return spec
    spec = stored_spec(document)
    with _stored_lock:
        _stored[key] = spec
        while len(_stored) > STORED_SPECS_KEPT:
            _stored.popitem(last=False)
    return spec


def parse_spec(data: Any) -> StudySpec:
    """Check the shape of a submitted spec (cheap: nothing is imported or read).

    Args:
        data: The request body.

    Returns:
        The spec, its sections typed; :func:`service_rules` and ``StudySpec.check`` come next.

    Raises:
        InvalidRequestError: The body is not a JSON object.
        ConfigError: A field is invalid, named by its dotted path.
    """
    from fedtune.tuning.spec import StudySpec

    body = as_mapping(
        data, "<body>", what=" (a JSON object: the study spec)", error=InvalidRequestError
    )
    return StudySpec.parse(dict(body))


def service_rules(spec: StudySpec, settings: Settings | None = None) -> None:
    """Apply the server's own rules to a parsed spec (:mod:`.spec_limits`).

    They run before ``StudySpec.check``, so a spec beyond a limit costs no deep validation.

    Args:
        spec: The spec, its shape checked (:func:`parse_spec`).
        settings: The service's settings, for sizes and data roots (None: the defaults).

    Raises:
        ConfigError: A rule is broken, named by the spec's dotted path.
    """
    from .settings import Settings

    settings = settings if settings is not None else Settings()
    check_spaces(spec.search)
    check_sizes(spec, settings)
    check_data_paths(spec.task, spec.search, list(settings.data_roots))
    if spec.tracking.uri is not None:
        raise ConfigError(
            "tracking.uri", "is set by the service (MLFLOW_TRACKING_URI); remove it from the spec"
        )


def accept_spec(data: Any, settings: Settings | None = None, *, rules: bool = True) -> AcceptedSpec:
    """Validate a submitted spec: its shape, the server's rules, then the spec in depth.

    Args:
        data: The request body.
        settings: The service's settings (None: the defaults).
        rules: False: the caller already applied :func:`service_rules` (the code-check child).

    Returns:
        What the service stores and schedules.

    Raises:
        InvalidRequestError: The body is not a JSON object.
        ConfigError: A field is invalid, named by its dotted path.
    """
    spec = parse_spec(data)
    if rules:
        service_rules(spec, settings)
    spec.check()
    return accepted_from(spec, spec.to_dict())


def accepted_from(spec: StudySpec, document: dict[str, Any]) -> AcceptedSpec:
    """The summary of ``spec`` with the document the service stores for it.

    Args:
        spec: The parsed spec.
        document: Its normalised document (``spec.to_dict()`` after ``check``).

    Returns:
        What the service stores and schedules.

    Raises:
        ConfigError: A number of ``document`` is NaN or infinite.
    """
    bad = _non_finite(document)
    if bad is not None:
        raise ConfigError(bad, "must be a finite number (JSON has no NaN or Infinity)")
    return AcceptedSpec(
        name=spec.name,
        algorithm=spec.algorithm,
        task=spec.task.name,
        trials=spec.budget.trials,
        max_concurrent=spec.budget.max_concurrent,
        cpu=float(spec.resources.cpu),
        gpu=float(spec.resources.gpu),
        experiment=spec.experiment,
        document=document,
        project=spec.project,
        priority=spec.priority,
        pack=spec.resources.pack,
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
