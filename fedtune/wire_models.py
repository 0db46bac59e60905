"""The API's answers, defined once for the service and the SDK: plain frozen dataclasses.

The service returns them from its routes (FastAPI takes a dataclass as a ``response_model``
and derives the OpenAPI schema from it: a class's docstring is its schema's description, a
field's ``metadata`` its ``description`` and bounds); the SDK builds them from the decoded JSON
with :meth:`WireModel.from_json`. One class per schema, so
the SDK's objects carry exactly the API's fields.

Pure Python: this module imports neither pydantic nor any server module, so
``import fedtune.client`` stays fast in the light install.
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
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fedtune.states import StudyState, TrialState

__all__ = [
    "AlgorithmOut",
    "BestTrial",
    "CodeOut",
    "CurveOut",
    "CurvePoint",
    "Identity",
    "MembershipOut",
    "MethodGroupOut",
    "MethodStudy",
    "MethodsOut",
    "MlflowLinks",
    "MlflowLoginOut",
    "Progress",
    "ProjectDetail",
    "ProjectOut",
    "Quota",
    "RecordedRun",
    "Revoked",
    "SearchSpaceOut",
    "StudyCounts",
    "StudyDetail",
    "StudyOut",
    "StudyPage",
    "TaskOut",
    "TokenInfo",
    "TokenOut",
    "TrialOut",
    "Usage",
    "UserOut",
    "WireModel",
    "finite_or_none",
]

W = TypeVar("W", bound="WireModel")


def _about(text: str, default: Any = dataclasses.MISSING) -> Any:
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


@dataclass(frozen=True, kw_only=True)
class StudyOut(WireModel):
    """A study as the list of studies shows it: no spec, progress, best trial or MLflow links."""

    id: str
    name: str
    state: StudyState
    algorithm: str
    task: str
    trials_requested: int
    backend: str | None
    attempts: int
    error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    heartbeat_at: dt.datetime | None
    code_sha256: str | None = _about("SHA-256 of the study's uploaded code", None)
    project: str | None = _about("the project it belongs to", None)
    owner: str | None = _about("the user who submitted it", None)
    priority: int = _about("within its project: higher starts first", 0)
    queued_reason: str | None = _about("why a queued study waits", None)

    @property
    def done(self) -> bool:
        """Whether the study has ended (succeeded, failed or cancelled)."""
        return StudyState(self.state).terminal


@dataclass(frozen=True, kw_only=True)
class Progress(WireModel):
    """A study's trials by state, out of the ``requested`` ones, and the compute it used."""

    requested: int = _about(
        "budget.trials; with a budget in compute and no trial count, the service's most "
        "(FEDTUNE_MAX_TRIALS)"
    )
    finished: int = _about("completed + pruned + failed trials")
    completed: int
    pruned: int
    failed: int
    killed: int
    running: int
    fraction: float = field(
        metadata={
            "ge": 0,
            "le": 1,
            "description": "the largest share of a budget used: trials finished, "
            "configuration_rounds of budget.configuration_rounds, seconds since its start of "
            "budget.time",
        }
    )
    configuration_rounds: int = _about("rounds its trials trained, all trials together", 0)


@dataclass(frozen=True, kw_only=True)
class BestTrial(WireModel):
    """The best trial: the driver's pick once the study has ended, until then the best completed
    trial so far."""

    number: int
    value: float | None
    params: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class MlflowLinks(WireModel):
    """Where the study's runs are tracked; a tracking URI's credentials and a local store's path
    are never shown."""

    tracking_uri: str | None
    experiment_id: str | None
    run_id: str | None
    run_url: str | None = _about(
        "the parent run in the MLflow UI, in its workspace (an MLflow server only)", None
    )
    ui_url: str | None = _about(
        "the MLflow UI to open, on the study's workspace (FEDTUNE_MLFLOW_PUBLIC_URL, else an "
        "http(s) tracking URI; null: the runs are in a file on the service's machine)",
        None,
    )
    workspace: str | None = _about(
        "the MLflow workspace of the study's project (null: MLflow keeps no workspaces)", None
    )
    login: str | None = _about(
        "the route that makes a member's MLflow login (`fedtune mlflow-login`), with workspaces",
        None,
    )


@dataclass(frozen=True, kw_only=True)
class StudyDetail(StudyOut):
    """One study: its summary, spec, progress, best trial and MLflow links."""

    spec: dict[str, Any]
    progress: Progress
    best: BestTrial | None
    mlflow: MlflowLinks


@dataclass(frozen=True, kw_only=True)
class StudyPage(WireModel):
    """One page of studies and the token of the next page (null on the last)."""

    items: list[StudyOut]
    total: int | None = _about(
        "studies matching the filters; counted on a first page (no page_token) or "
        "with include_total=true, null on pages reached by token"
    )
    limit: int
    offset: int
    next_page_token: str | None = _about(
        "pass as page_token for the next page; null on the last page", None
    )


@dataclass(frozen=True, kw_only=True)
class TrialOut(WireModel):
    """One trial of a study."""

    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None
    outcome: str | None
    last_round: int
    mlflow_run_id: str | None
    started_at: dt.datetime
    finished_at: dt.datetime | None


@dataclass(frozen=True, kw_only=True)
class CurvePoint(WireModel):
    """One round of a trial's learning curve: the metrics it logged."""

    round: int
    metrics: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class CurveOut(WireModel):
    """A trial's learning curve, round by round."""

    study_id: str
    trial: int
    rounds: list[CurvePoint]


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


@dataclass(frozen=True, kw_only=True)
class MethodsOut(WireModel):
    """A study of methods as submitted: one study per algorithm, and how to compare them."""

    studies: list[StudyDetail]
    compare_url: str = _about("GET it to compare the studies; POST it to record the comparison")
    group: str = _about("the study of methods' id (its comparison is recorded once all end)")
    group_url: str = _about("GET it for the studies' states and the recorded comparison")


@dataclass(frozen=True, kw_only=True)
class RecordedRun(WireModel):
    """Where a comparison was recorded in MLflow, or why it was not (``error``)."""

    run_id: str | None = None
    experiment_id: str | None = None
    tracking_uri: str | None = None
    run_url: str | None = _about("the run in the MLflow UI (null: no UI to link to)", None)
    error: str | None = _about("why no comparison was recorded (the other fields are null)", None)


@dataclass(frozen=True, kw_only=True)
class MethodStudy(WireModel):
    """One study of a study of methods."""

    id: str
    algorithm: str
    state: StudyState


@dataclass(frozen=True, kw_only=True)
class MethodGroupOut(WireModel):
    """A study of methods: its studies and, once they have all ended, their comparison."""

    id: str
    name: str
    project: str
    studies: list[MethodStudy]
    compare_url: str
    comparison: RecordedRun | None = field(
        default=None,
        metadata={
            "description": "null until every study has ended; then the MLflow run recorded, "
            "or why there is none"
        },
    )


# ---------------------------------------------------------------- discovery and code


@dataclass(frozen=True, kw_only=True)
class AlgorithmOut(WireModel):
    """An algorithm the service offers: its paper, searched hyperparameters and defaults."""

    name: str
    summary: str
    paper: str
    params: list[str]
    defaults: dict[str, Any]
    fixed: dict[str, Any]
    server_opts: list[str]


@dataclass(frozen=True, kw_only=True)
class TaskOut(WireModel):
    """A task the service offers."""

    name: str
    description: str


@dataclass(frozen=True, kw_only=True)
class SearchSpaceOut(WireModel):
    """A search space the service ships: the algorithms it fits and its parameters."""

    name: str
    description: str
    algorithms: list[str]
    parameters: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class CodeOut(WireModel):
    """An uploaded code package."""

    sha256: str = _about("SHA-256 of the package: name it as code.sha256 in a spec")
    size: int
    created: bool = _about("False when identical code was stored before")


# ---------------------------------------------------------------- identity and projects


@dataclass(frozen=True, kw_only=True)
class Identity(WireModel):
    """Who a bearer token authenticates (``GET /v1/whoami``)."""

    name: str
    admin: bool
    projects: dict[str, str] = field(
        metadata={"description": "the caller's role per project: member or viewer"}
    )
    via: str = _about("how it authenticated: token, oidc, or open (a service without tokens)")


@dataclass(frozen=True, kw_only=True)
class TokenInfo(WireModel):
    """A live token of a user: its id, never its secret."""

    id: str
    expires_at: dt.datetime | None
    label: str | None


@dataclass(frozen=True, kw_only=True)
class UserOut(WireModel):
    """A user with its roles and live tokens (``GET /v1/users``, admins only)."""

    name: str
    admin: bool
    projects: dict[str, str] = field(metadata={"description": "role per project: member or viewer"})
    tokens: list[TokenInfo]
    created_at: dt.datetime


@dataclass(frozen=True, kw_only=True)
class TokenOut(WireModel):
    """A token just issued: its secret is shown this once (only its hash is stored)."""

    user: str
    token_id: str
    token: str = _about("shown once: only its hash is stored")
    expires_at: dt.datetime | None


@dataclass(frozen=True, kw_only=True)
class MlflowLoginOut(WireModel):
    """A user's MLflow login: shown once, to its owner (fedtune does not store the password)."""

    user: str
    workspaces: list[str] = field(
        metadata={"description": "the MLflow workspaces of the user's projects"}
    )
    password: str = _about("the user's new MLflow password; the old one stops working")


@dataclass(frozen=True, kw_only=True)
class Revoked(WireModel):
    """How many live tokens a revocation ended."""

    revoked: int


@dataclass(frozen=True, kw_only=True)
class MembershipOut(WireModel):
    """A user's role in a project, as the service stored it."""

    user: str
    project: str
    role: str


@dataclass(frozen=True, kw_only=True)
class Quota(WireModel):
    """A project's quotas (``null``: unlimited)."""

    gpus: float | None = _about("GPUs its studies may reserve at once")
    trials: int | None = _about("configurations its studies may train at once")
    studies: int | None = _about("active (queued or running) studies")
    gpu_hours: float | None = _about(
        "GPU-hours its studies may use or hold within the fair-share window"
        " (FEDTUNE_FAIR_SHARE_WINDOW_S): used, plus what running studies may still use,"
        " plus what a new one may use (GPUs × budget.time)",
        None,
    )


@dataclass(frozen=True, kw_only=True)
class ProjectOut(WireModel):
    """A project: its owner, quotas, fair-share weight and highest priority."""

    name: str
    owner: str | None
    quota: Quota
    weight: float = _about("fair-share weight")
    max_priority: int = _about("the highest priority its studies may ask for")
    queue_name: str | None = _about("its Kueue LocalQueue, when Kueue schedules")


@dataclass(frozen=True, kw_only=True)
class StudyCounts(WireModel):
    """A project's live studies by state."""

    queued: int
    running: int


@dataclass(frozen=True, kw_only=True)
class Usage(WireModel):
    """What a project's running studies reserve now, against its quota."""

    studies: StudyCounts
    gpus: float = _about("GPUs reserved: each running study's trial processes × resources.gpu")
    trials: int = _about("configurations reserved: each running study's budget.max_concurrent")
    gpu_hours: float | None = _about(
        "GPU-hours counted against quota.gpu_hours: used within the fair-share window, plus"
        " what running studies may still use (null: a running study has no time limit)",
        None,
    )


@dataclass(frozen=True, kw_only=True)
class ProjectDetail(ProjectOut):
    """A project with what it uses now (``GET /v1/projects/{project}``)."""

    usage: Usage
