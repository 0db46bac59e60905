"""The API's answers, defined once for the service and the SDK: plain frozen dataclasses.

The service returns them from its routes (FastAPI takes a dataclass as a ``response_model``
and derives the OpenAPI schema from it: a class's docstring is its schema's description, a
field's ``metadata`` its ``description`` and bounds); the SDK builds them from the decoded JSON
with :meth:`~fedtune.wire_base.WireModel.from_json`. One class per schema, so the SDK's objects
carry exactly the API's fields. How an answer goes to and comes from JSON:
:mod:`fedtune.wire_base`.

Pure Python: this module imports neither pydantic nor any server module, so
``import fedtune.client`` stays fast in the light install.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from fedtune.states import StudyState, TrialState
from fedtune.wire_base import WireModel, described

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
    "StudyEvent",
    "StudyOut",
    "StudyPage",
    "TaskOut",
    "TokenInfo",
    "TokenOut",
    "TrialOut",
    "Usage",
    "UserOut",
]


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
    code_sha256: str | None = described("SHA-256 of the study's uploaded code", None)
    project: str | None = described("the project it belongs to", None)
    owner: str | None = described("the user who submitted it", None)
    priority: int = described("within its project: higher starts first", 0)
    queued_reason: str | None = described("why a queued study waits", None)

    @property
    def done(self) -> bool:
        """Whether the study has ended (succeeded, failed or cancelled)."""
        return StudyState(self.state).terminal


@dataclass(frozen=True, kw_only=True)
class Progress(WireModel):
    """A study's trials by state, out of the ``requested`` ones, and the compute it used."""

    requested: int = described(
        "budget.trials; with a budget in compute and no trial count, the service's most "
        "(FEDTUNE_MAX_TRIALS)"
    )
    finished: int = described("completed + pruned + failed trials")
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
    configuration_rounds: int = described("rounds its trials trained, all trials together", 0)


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
    run_url: str | None = described(
        "the parent run in the MLflow UI, in its workspace (an MLflow server only)", None
    )
    ui_url: str | None = described(
        "the MLflow UI to open, on the study's workspace (FEDTUNE_MLFLOW_PUBLIC_URL, else an "
        "http(s) tracking URI; null: the runs are in a file on the service's machine)",
        None,
    )
    workspace: str | None = described(
        "the MLflow workspace of the study's project (null: MLflow keeps no workspaces)", None
    )
    login: str | None = described(
        "the route that makes a member's MLflow login (`fedtune mlflow-login`), with workspaces",
        None,
    )


@dataclass(frozen=True, kw_only=True)
class StudyEvent(WireModel):
    """Something that happened to a study that its state does not say."""

    at: dt.datetime
    kind: str = described(
        "driver_ticket_reused: the dispatch attempt's one-time start ticket was redeemed a "
        "second time, so someone other than its driver read it; the attempt's driver "
        "credential was revoked and, while the study ran, it was re-dispatched"
    )
    attempt: int = described("the dispatch attempt it concerns")
    message: str


@dataclass(frozen=True, kw_only=True)
class StudyDetail(StudyOut):
    """One study: its summary, spec, progress, best trial, MLflow links and events."""

    spec: dict[str, Any]
    progress: Progress
    best: BestTrial | None
    mlflow: MlflowLinks
    events: list[StudyEvent] = field(
        default_factory=list,
        metadata={"description": "security events of its dispatch attempts, oldest first"},
    )


@dataclass(frozen=True, kw_only=True)
class StudyPage(WireModel):
    """One page of studies and the token of the next page (null on the last)."""

    items: list[StudyOut]
    total: int | None = described(
        "studies matching the filters; counted on a first page (no page_token) or "
        "with include_total=true, null on pages reached by token"
    )
    limit: int
    offset: int
    next_page_token: str | None = described(
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


@dataclass(frozen=True, kw_only=True)
class MethodsOut(WireModel):
    """A study of methods as submitted: one study per algorithm, and how to compare them."""

    studies: list[StudyDetail]
    compare_url: str = described("GET it to compare the studies; POST it to record the comparison")
    group: str = described("the study of methods' id (its comparison is recorded once all end)")
    group_url: str = described("GET it for the studies' states and the recorded comparison")


@dataclass(frozen=True, kw_only=True)
class RecordedRun(WireModel):
    """Where a comparison was recorded in MLflow, or why it was not (``error``)."""

    run_id: str | None = None
    experiment_id: str | None = None
    tracking_uri: str | None = None
    run_url: str | None = described("the run in the MLflow UI (null: no UI to link to)", None)
    error: str | None = described(
        "why no comparison was recorded (the other fields are null)", None
    )


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

    sha256: str = described("SHA-256 of the package: name it as code.sha256 in a spec")
    size: int
    created: bool = described("False when identical code was stored before")
    check_timeout_s: float | None = described(
        "the longest the service checks a study using this code (FEDTUNE_CODE_CHECK_TIMEOUT_S): "
        "a submission's answer may take that long, and a retry with the same Idempotency-Key "
        "waits for it",
        None,
    )


# ---------------------------------------------------------------- identity and projects


@dataclass(frozen=True, kw_only=True)
class Identity(WireModel):
    """Who a bearer token authenticates (``GET /v1/whoami``)."""

    name: str
    admin: bool
    projects: dict[str, str] = field(
        metadata={"description": "the caller's role per project: member or viewer"}
    )
    via: str = described("how it authenticated: token, oidc, or open (a service without tokens)")


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
    token: str = described("shown once: only its hash is stored")
    expires_at: dt.datetime | None


@dataclass(frozen=True, kw_only=True)
class MlflowLoginOut(WireModel):
    """A user's MLflow login: shown once, to its owner (fedtune does not store the password)."""

    user: str
    workspaces: list[str] = field(
        metadata={"description": "the MLflow workspaces of the user's projects"}
    )
    password: str = described("the user's new MLflow password; the old one stops working")


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

    gpus: float | None = described("GPUs its studies may reserve at once")
    trials: int | None = described("configurations its studies may train at once")
    studies: int | None = described("active (queued or running) studies")
    gpu_hours: float | None = described(
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
    weight: float = described("fair-share weight")
    max_priority: int = described("the highest priority its studies may ask for")
    queue_name: str | None = described("its Kueue LocalQueue, when Kueue schedules")


@dataclass(frozen=True, kw_only=True)
class StudyCounts(WireModel):
    """A project's live studies by state."""

    queued: int
    running: int


@dataclass(frozen=True, kw_only=True)
class Usage(WireModel):
    """What a project's running studies reserve now, against its quota."""

    studies: StudyCounts
    gpus: float = described("GPUs reserved: each running study's trial processes × resources.gpu")
    trials: int = described("configurations reserved: each running study's budget.max_concurrent")
    gpu_hours: float | None = described(
        "GPU-hours counted against quota.gpu_hours: used within the fair-share window, plus"
        " what running studies may still use (null: a running study has no time limit)",
        None,
    )


@dataclass(frozen=True, kw_only=True)
class ProjectDetail(ProjectOut):
    """A project with what it uses now (``GET /v1/projects/{project}``)."""

    usage: Usage
