"""``/v1/driver/studies/{id}``: where a study's driver reports, with a credential of its own.

A driver starts with a one-time ticket (``FEDTUNE_DRIVER_TICKET``: :mod:`..tickets`), never a
credential, and never the service's database URL. ``POST …/ticket`` exchanges the ticket, once,
for the driver's credential (valid for that study as that dispatch attempt) and its project's
MLflow login; a second redemption marks the attempt compromised (409), which revokes the
credential. The other routes are the driver's only way in, with that credential: they read and
write that study's rows only (:mod:`..driver_ops`), a credential of another study or a forged
one is 404 (no existence oracle), a revoked one 401, and a superseded attempt's writes are 409.
They are internal: left out of the OpenAPI document, and the bearer-token middleware passes them
to the credential check here (``auth.OWN_CREDENTIAL``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Path, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from fedtune.errors import ConflictError

from .. import driver_ops, tickets
from ..errors import StudyNotFoundError
from ..mlflow_workspaces import driver_env_for
from ..states import StudyState, TrialState
from ..tickets import DriverAccess
from .auth import bearer_token
from .deps import Ctx

__all__ = ["router"]

router = APIRouter(prefix="/v1/driver/studies/{study_id}", include_in_schema=False)
StudyId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]
#: no cache between a driver and the service keeps a credential
NO_STORE = {"Cache-Control": "no-store"}


def driver_access(
    ctx: Ctx, study_id: StudyId, authorization: Annotated[str | None, Header()] = None
) -> DriverAccess:
    """The attempt the caller's driver credential is valid for, and the study's current one
    (404 for anything that is no credential of this study, 401 for a revoked one)."""
    scheme, _, token = (authorization or "").partition(" ")
    access = None
    if scheme.lower() == "bearer" and token.strip():
        access = driver_ops.access(ctx.db, study_id, token.strip())
    if access is None:
        raise StudyNotFoundError(f"no study {study_id!r}")
    return access


Access = Annotated[DriverAccess, Depends(driver_access)]


class MlflowLoginOut(BaseModel):
    username: str
    password: str


class CredentialsOut(BaseModel):
    attempt: int
    token: str
    mlflow: MlflowLoginOut | None = None


@router.post("/ticket", response_model=CredentialsOut)
async def redeem_ticket(
    ctx: Ctx,
    study_id: StudyId,
    response: Response,
    authorization: Annotated[str | None, Header()] = None,
) -> CredentialsOut:
    """Exchange the driver's start ticket (``Authorization: Bearer <ticket>``) for its
    credentials, once (:func:`..tickets.redeem`)."""
    ticket = bearer_token(authorization)
    redeemed = await run_in_threadpool(tickets.redeem, ctx.db, study_id, ticket)
    login = driver_env_for(ctx.settings, redeemed.project)
    mlflow = None
    if "MLFLOW_TRACKING_PASSWORD" in login:
        mlflow = MlflowLoginOut(
            username=login["MLFLOW_TRACKING_USERNAME"], password=login["MLFLOW_TRACKING_PASSWORD"]
        )
    response.headers.update(NO_STORE)
    return CredentialsOut(attempt=redeemed.attempt, token=redeemed.token, mlflow=mlflow)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FinalValues(_Body):
    error: str | None = Field(None, max_length=4000)
    best_trial: int | None = Field(None, ge=0)
    best_value: float | None = None
    mlflow_experiment_id: str | None = Field(None, max_length=64)
    mlflow_run_id: str | None = Field(None, max_length=64)


class FinishIn(_Body):
    state: Literal[StudyState.SUCCEEDED, StudyState.FAILED]
    values: FinalValues = Field(default_factory=FinalValues)


class MlflowIn(_Body):
    run_id: str = Field(max_length=64)
    experiment_id: str | None = Field(None, max_length=64)


class TrialStartIn(_Body):
    params: dict[str, Any] = Field(default_factory=dict)
    run_id: str | None = Field(None, max_length=64)


class TrialEndIn(_Body):
    state: TrialState
    value: float | None = None
    outcome: str | None = Field(None, max_length=64)


class CurveIn(_Body):
    rounds: list[int] = Field(default_factory=list, max_length=1_000_000)
    loss: list[float | None] = Field(default_factory=list, max_length=1_000_000)


class FinishedTrialIn(_Body):
    number: int = Field(ge=0)
    params: dict[str, Any] = Field(default_factory=dict)
    run_id: str | None = Field(None, max_length=64)
    state: TrialState
    value: float | None = None
    outcome: str | None = Field(None, max_length=64)
    curve: CurveIn = Field(default_factory=CurveIn)


class RecoverIn(_Body):
    reason: str = Field(max_length=4000)
    counts: bool = True


def _current(study_id: str, access: DriverAccess) -> None:
    """Writes come from the study's current attempt only (409 for a superseded driver)."""
    if access.current != access.attempt:
        raise ConflictError(
            f"attempt {access.attempt} of study {study_id} was superseded by {access.current}"
        )


@router.get("", response_model=driver_ops.Claim)
async def claim(ctx: Ctx, study_id: StudyId, access: Access) -> driver_ops.Claim:
    return await run_in_threadpool(driver_ops.claim, ctx.db, study_id)


@router.post("/heartbeat")
async def heartbeat(ctx: Ctx, study_id: StudyId, access: Access) -> bool:
    return await run_in_threadpool(driver_ops.heartbeat, ctx.db, study_id, access.attempt)


@router.post("/finish")
async def finish(ctx: Ctx, study_id: StudyId, access: Access, body: FinishIn) -> bool:
    _current(study_id, access)
    values = body.values.model_dump(exclude_unset=True)
    return await run_in_threadpool(driver_ops.finish, ctx.db, study_id, body.state, values)


@router.post("/trials/reset")
async def reset_trials(ctx: Ctx, study_id: StudyId, access: Access) -> int:
    _current(study_id, access)
    return await run_in_threadpool(driver_ops.reset_trials, ctx.db, study_id)


@router.post("/mlflow", status_code=204)
async def mlflow_ids(ctx: Ctx, study_id: StudyId, access: Access, body: MlflowIn) -> Response:
    _current(study_id, access)
    await run_in_threadpool(
        driver_ops.set_mlflow_ids, ctx.db, study_id, body.run_id, body.experiment_id
    )
    return Response(status_code=204)


@router.post("/trials/{number}/start", status_code=204)
async def trial_started(
    ctx: Ctx,
    study_id: StudyId,
    access: Access,
    number: Annotated[int, Path(ge=0)],
    body: TrialStartIn,
) -> Response:
    _current(study_id, access)
    await run_in_threadpool(
        driver_ops.trial_started, ctx.db, study_id, number, body.params, body.run_id
    )
    return Response(status_code=204)


@router.post("/trials/{number}/rounds", status_code=204)
async def record_rounds(
    ctx: Ctx,
    study_id: StudyId,
    access: Access,
    number: Annotated[int, Path(ge=0)],
    rows: Annotated[list[dict[str, float | int | str | None]], Body(max_length=100_000)],
) -> Response:
    _current(study_id, access)
    await run_in_threadpool(driver_ops.record_rounds, ctx.db, study_id, number, rows)
    return Response(status_code=204)


@router.post("/trials/{number}/end", status_code=204)
async def trial_ended(
    ctx: Ctx,
    study_id: StudyId,
    access: Access,
    number: Annotated[int, Path(ge=0)],
    body: TrialEndIn,
) -> Response:
    _current(study_id, access)
    await run_in_threadpool(
        driver_ops.trial_ended, ctx.db, study_id, number, body.state, body.value, body.outcome
    )
    return Response(status_code=204)


@router.post("/trials/finished")
async def finished_trials(
    ctx: Ctx,
    study_id: StudyId,
    access: Access,
    records: Annotated[list[FinishedTrialIn], Body(max_length=100_000)],
) -> int:
    _current(study_id, access)
    rows = [record.model_dump() for record in records]
    return await run_in_threadpool(driver_ops.apply_finished_trials, ctx.db, study_id, rows)


@router.post("/recover")
async def recover(ctx: Ctx, study_id: StudyId, access: Access, body: RecoverIn) -> str:
    _current(study_id, access)
    return await run_in_threadpool(
        driver_ops.recover,
        ctx.db,
        study_id,
        access.attempt,
        body.reason,
        ctx.settings.max_dispatch_attempts,
        counts=body.counts,
    )


@router.get("/code")
async def code(ctx: Ctx, study_id: StudyId, access: Access) -> Response:
    package = await run_in_threadpool(driver_ops.study_package, ctx.db, study_id)
    if package is None:
        raise StudyNotFoundError(f"study {study_id!r} has no code package")
    return Response(package, media_type="application/zip")
