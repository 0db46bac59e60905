"""``/v1/driver/studies/{id}``: where a study's driver reports, with a credential of its own.

A driver holds ``FEDTUNE_DRIVER_TOKEN`` (:func:`..driver_link.driver_token`: valid for one study
and one dispatch attempt), never the service's database URL. These routes are its only way in:
they read and write that study's rows only (:mod:`..driver_ops`), a token of another study or a
forged one is 404 (no existence oracle), and a superseded attempt's writes are 409. They are
internal: left out of the OpenAPI document, and the bearer-token middleware passes them to the
credential check here (``auth.OWN_CREDENTIAL``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Path, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from fedtune.errors import ConflictError

from .. import driver_ops
from ..code_url import code_url_key
from ..driver_link import verify_driver_token
from ..errors import StudyNotFoundError
from ..states import StudyState, TrialState
from .deps import Ctx

__all__ = ["router"]

router = APIRouter(prefix="/v1/driver/studies/{study_id}", include_in_schema=False)
StudyId = Annotated[str, Path(pattern=r"^[0-9a-f]{12}$")]


def driver_attempt(
    ctx: Ctx, study_id: StudyId, authorization: Annotated[str | None, Header()] = None
) -> int:
    """The dispatch attempt the caller's driver token is valid for (404 when it is none)."""
    scheme, _, token = (authorization or "").partition(" ")
    attempt = None
    if scheme.lower() == "bearer" and token:
        attempt = verify_driver_token(code_url_key(ctx.settings), study_id, token.strip())
    if attempt is None:
        raise StudyNotFoundError(f"no study {study_id!r}")
    return attempt


Attempt = Annotated[int, Depends(driver_attempt)]


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


async def _current(ctx: Ctx, study_id: str, attempt: int) -> None:
    """Writes come from the study's current attempt only (409 for a superseded driver)."""
    current = await run_in_threadpool(driver_ops.current_attempt, ctx.db, study_id)
    if current != attempt:
        raise ConflictError(f"attempt {attempt} of study {study_id} was superseded by {current}")


@router.get("", response_model=driver_ops.Claim)
async def claim(ctx: Ctx, study_id: StudyId, attempt: Attempt) -> driver_ops.Claim:
    return await run_in_threadpool(driver_ops.claim, ctx.db, study_id)


@router.post("/heartbeat")
async def heartbeat(ctx: Ctx, study_id: StudyId, attempt: Attempt) -> bool:
    return await run_in_threadpool(driver_ops.heartbeat, ctx.db, study_id, attempt)


@router.post("/finish")
async def finish(ctx: Ctx, study_id: StudyId, attempt: Attempt, body: FinishIn) -> bool:
    await _current(ctx, study_id, attempt)
    values = body.values.model_dump(exclude_unset=True)
    return await run_in_threadpool(driver_ops.finish, ctx.db, study_id, body.state, values)


@router.post("/trials/reset")
async def reset_trials(ctx: Ctx, study_id: StudyId, attempt: Attempt) -> int:
    await _current(ctx, study_id, attempt)
    return await run_in_threadpool(driver_ops.reset_trials, ctx.db, study_id)


@router.post("/mlflow", status_code=204)
async def mlflow_ids(ctx: Ctx, study_id: StudyId, attempt: Attempt, body: MlflowIn) -> Response:
    await _current(ctx, study_id, attempt)
    await run_in_threadpool(
        driver_ops.set_mlflow_ids, ctx.db, study_id, body.run_id, body.experiment_id
    )
    return Response(status_code=204)


@router.post("/trials/{number}/start", status_code=204)
async def trial_started(
    ctx: Ctx,
    study_id: StudyId,
    attempt: Attempt,
    number: Annotated[int, Path(ge=0)],
    body: TrialStartIn,
) -> Response:
    await _current(ctx, study_id, attempt)
    await run_in_threadpool(
        driver_ops.trial_started, ctx.db, study_id, number, body.params, body.run_id
    )
    return Response(status_code=204)


@router.post("/trials/{number}/rounds", status_code=204)
async def record_rounds(
    ctx: Ctx,
    study_id: StudyId,
    attempt: Attempt,
    number: Annotated[int, Path(ge=0)],
    rows: Annotated[list[dict[str, float | int | str | None]], Body(max_length=100_000)],
) -> Response:
    await _current(ctx, study_id, attempt)
    await run_in_threadpool(driver_ops.record_rounds, ctx.db, study_id, number, rows)
    return Response(status_code=204)


@router.post("/trials/{number}/end", status_code=204)
async def trial_ended(
    ctx: Ctx,
    study_id: StudyId,
    attempt: Attempt,
    number: Annotated[int, Path(ge=0)],
    body: TrialEndIn,
) -> Response:
    await _current(ctx, study_id, attempt)
    await run_in_threadpool(
        driver_ops.trial_ended, ctx.db, study_id, number, body.state, body.value, body.outcome
    )
    return Response(status_code=204)


@router.post("/trials/finished")
async def finished_trials(
    ctx: Ctx,
    study_id: StudyId,
    attempt: Attempt,
    records: Annotated[list[FinishedTrialIn], Body(max_length=100_000)],
) -> int:
    await _current(ctx, study_id, attempt)
    rows = [record.model_dump() for record in records]
    return await run_in_threadpool(driver_ops.apply_finished_trials, ctx.db, study_id, rows)


@router.post("/recover")
async def recover(ctx: Ctx, study_id: StudyId, attempt: Attempt, body: RecoverIn) -> str:
    await _current(ctx, study_id, attempt)
    return await run_in_threadpool(
        driver_ops.recover,
        ctx.db,
        study_id,
        attempt,
        body.reason,
        ctx.settings.max_dispatch_attempts,
        counts=body.counts,
    )


@router.get("/code")
async def code(ctx: Ctx, study_id: StudyId, attempt: Attempt) -> Response:
    package = await run_in_threadpool(driver_ops.study_package, ctx.db, study_id)
    if package is None:
        raise StudyNotFoundError(f"study {study_id!r} has no code package")
    return Response(package, media_type="application/zip")
