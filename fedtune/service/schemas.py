"""API schemas: the answers' shape, kept apart from the SQLAlchemy models.

The answers about studies, trials, curves and trade-offs are the dataclasses of
:mod:`fedtune.wire_models`, shared with the SDK (re-exported here); the others are pydantic
models. The request body of ``POST /v1/studies`` is the study spec itself
(``fedtune.tuning.StudySpec``, validated by the service so errors name the spec's dotted field
path).
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from fedtune.results import Comparison, TradeOff
from fedtune.wire_models import (
    AlgorithmOut,
    BestTrial,
    CodeOut,
    CurveOut,
    CurvePoint,
    MethodGroupOut,
    MethodsOut,
    MlflowLinks,
    Progress,
    SearchSpaceOut,
    StudyDetail,
    StudyEvent,
    StudyOut,
    StudyPage,
    TaskOut,
    TrialOut,
)

__all__ = [
    "AlgorithmOut",
    "BestTrial",
    "CodeOut",
    "Comparison",
    "CurveOut",
    "CurvePoint",
    "ErrorDetail",
    "ErrorResponse",
    "Health",
    "MethodGroupOut",
    "MethodsOut",
    "MlflowLinks",
    "Progress",
    "Readiness",
    "SearchSpaceOut",
    "StudyDetail",
    "StudyEvent",
    "StudyOut",
    "StudyPage",
    "TaskOut",
    "TradeOff",
    "TrialOut",
    "dump_json",
]


class _Out(BaseModel):
    model_config = ConfigDict(from_attributes=True, frozen=True)


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def dump_json(answer: Any) -> bytes:
    """An answer as JSON, as FastAPI would send it for its response model.

    Args:
        answer: a pydantic model or a dataclass of :mod:`fedtune.wire_models`.

    Returns:
        The JSON document.
    """
    if isinstance(answer, BaseModel):
        return answer.model_dump_json().encode()
    return _adapter(type(answer)).dump_json(answer)


class ErrorDetail(_Out):
    code: str = Field(description="stable machine-readable code, e.g. study_not_found")
    message: str
    field: str | None = Field(None, description="dotted path of the offending field, if any")


class ErrorResponse(_Out):
    error: ErrorDetail


class Health(_Out):
    status: str


class BackendReadiness(_Out):
    kind: str = Field(description="the execution backend (FEDTUNE_BACKEND)")
    up: bool | None = Field(description="whether studies can be launched; null: not known yet")
    reason: str | None = Field(None, description="why not (authentication failed, unreachable)")


class MlflowReadiness(_Out):
    up: bool | None = Field(
        description="whether the service's last sync of MLflow's workspaces, users and roles "
        "worked; null: none has ended yet"
    )
    reason: str | None = Field(
        None, description="MLflow's answer or the connection's error (no project or user names)"
    )


class Readiness(_Out):
    status: str = Field(
        description="ready; degraded while the backend cannot launch studies or the MLflow "
        "sync fails"
    )
    database: str
    revision: str | None
    backend: BackendReadiness | None = Field(
        None, description="the backend's state (absent without a scheduler: backend none)"
    )
    auth: str = Field(
        "token",
        description="how /v1 calls authenticate: token, oidc, token+oidc, or "
        "'open: tokens are not checked'",
    )
    code_sandbox: str | None = Field(
        None,
        description="how uploaded code is isolated: bwrap, or 'none: …' when the operator "
        "turned the sandbox off (null while code upload is off)",
    )
    mlflow: MlflowReadiness | None = Field(
        None,
        description="the MLflow tenancy's state (absent without FEDTUNE_MLFLOW_WORKSPACES)",
    )
