"""API schemas (pydantic): the answers' shape, kept apart from the SQLAlchemy models.

The request body of ``POST /v1/studies`` is the study spec itself (``fedtune.tuning.StudySpec``,
validated by the service so errors name the spec's dotted field path).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .states import StudyState, TrialState

__all__ = [
    "AlgorithmOut",
    "BestTrial",
    "CodeOut",
    "CurveOut",
    "CurvePoint",
    "ErrorDetail",
    "ErrorResponse",
    "Health",
    "MlflowLinks",
    "Progress",
    "Readiness",
    "SearchSpaceOut",
    "StudyDetail",
    "StudyOut",
    "StudyPage",
    "TaskOut",
    "TradeoffOut",
    "TrialOut",
]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True, frozen=True)


class ErrorDetail(_Out):
    code: str = Field(description="stable machine-readable code, e.g. study_not_found")
    message: str
    field: str | None = Field(None, description="dotted path of the offending field, if any")


class ErrorResponse(_Out):
    error: ErrorDetail


class StudyOut(_Out):
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
    code_sha256: str | None = Field(None, description="SHA-256 of the study's uploaded code")
    project: str | None = Field(None, description="the project it belongs to")
    owner: str | None = Field(None, description="the user who submitted it")
    priority: int = Field(0, description="within its project: higher starts first")
    queued_reason: str | None = Field(None, description="why a queued study waits")


class CodeOut(_Out):
    sha256: str = Field(description="SHA-256 of the package: name it as code.sha256 in a spec")
    size: int
    created: bool = Field(description="False when identical code was stored before")


class Progress(_Out):
    requested: int
    finished: int = Field(description="completed + pruned + failed trials")
    completed: int
    pruned: int
    failed: int
    killed: int
    running: int
    fraction: float = Field(ge=0, le=1)


class BestTrial(_Out):
    number: int
    value: float | None
    params: dict[str, Any]


class MlflowLinks(_Out):
    tracking_uri: str | None
    experiment_id: str | None
    run_id: str | None
    run_url: str | None = Field(None, description="the parent run in the MLflow UI (http URIs)")


class StudyDetail(StudyOut):
    spec: dict[str, Any]
    progress: Progress
    best: BestTrial | None
    mlflow: MlflowLinks


class StudyPage(_Out):
    items: list[StudyOut]
    total: int | None = Field(
        description="studies matching the filters; counted on a first page (no page_token) or "
        "with include_total=true, null on pages reached by token"
    )
    limit: int
    offset: int
    next_page_token: str | None = Field(
        None, description="pass as page_token for the next page; null on the last page"
    )


class TrialOut(_Out):
    number: int
    state: TrialState
    params: dict[str, Any]
    value: float | None
    outcome: str | None
    last_round: int
    mlflow_run_id: str | None
    started_at: dt.datetime
    finished_at: dt.datetime | None


class CurvePoint(_Out):
    round: int
    metrics: dict[str, Any]


class CurveOut(_Out):
    study_id: str
    trial: int
    rounds: list[CurvePoint]


class TradeoffOut(_Out):
    """``fedtune.tuning.tradeoff.TradeOff.to_dict()`` (∞ → null): once the study has ended,
    MLflow's ``tradeoff/tradeoff.json`` of its parent run, byte for byte."""

    metric: str
    start_loss: float | None = None
    targets: list[float | None]
    pareto_target: float | None
    last_rounds: int
    smooth_window: int
    trials: list[dict[str, Any]]
    pareto: list[int]
    envelope: list[dict[str, Any]]
    regime_changes: list[dict[str, Any]]
    notes: dict[str, str]


class AlgorithmOut(_Out):
    name: str
    summary: str
    paper: str
    params: list[str]
    defaults: dict[str, Any]
    fixed: dict[str, Any]
    server_opts: list[str]


class TaskOut(_Out):
    name: str
    description: str


class SearchSpaceOut(_Out):
    name: str
    description: str
    algorithms: list[str]
    parameters: dict[str, Any]


class Health(_Out):
    status: str


class Readiness(_Out):
    status: str
    database: str
    revision: str | None
