"""Studies and their trials: submit, list, get, cancel, trials, curve, trade-off.

Handlers parse the request, call one service function and shape the answer.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query, Request, Response

from .. import services
from ..paging import Order
from ..schemas import (
    CurveOut,
    ErrorResponse,
    StudyDetail,
    StudyPage,
    TradeOff,
    TrialOut,
    dump_json,
)
from ..states import StudyState, TrialState
from .auth import Caller
from .deps import Ctx

__all__ = ["router"]

router = APIRouter(prefix="/v1/studies", tags=["studies"])

StudyId = Annotated[str, Path(description="the study id (12 hex digits)", max_length=64)]
TrialNumber = Annotated[int, Path(ge=0, le=2**31 - 1, description="Optuna trial number")]
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "no bearer token"},
    403: {"model": ErrorResponse, "description": "a viewer of the study's project changing it"},
    404: {"model": ErrorResponse, "description": "no such study or trial, or not the caller's"},
}
_EXAMPLE = {
    "name": "quadratic-fedavg",
    "task": {"name": "quadratic", "clients": 8, "dim": 4},
    "algorithm": "fedavg",
    "train": {"rounds": 20, "clients_per_round": 4, "local_steps": 5, "batch_size": 4},
    "objective": {"last_rounds": 5},
    "scheduler": {"name": "none"},
    "budget": {"trials": 4, "max_concurrent": 1},
}
SpecBody = Annotated[
    dict[str, Any],
    Body(
        description="A study spec (fedtune.tuning.StudySpec): task, algorithm, train, search, "
        "objective, sampler, scheduler, budget, resources, tracking.",
        openapi_examples={"quadratic": {"summary": "a tiny study", "value": _EXAMPLE}},
    ),
]


def _json(answer: Any) -> Response:
    """``answer`` as JSON: it is already the route's response model, built by the service, so
    FastAPI's validation pass (a third of a list's CPU) is skipped."""
    return Response(dump_json(answer), media_type="application/json")


@router.post(
    "",
    status_code=201,
    response_model=StudyDetail,
    responses={
        200: {"model": StudyDetail, "description": "replayed: same Idempotency-Key and body"},
        409: {
            "model": ErrorResponse,
            "description": "Idempotency-Key reused with another body; or submission_in_progress "
            "(with Retry-After): another request with the key is still having its code checked",
        },
        413: {"model": ErrorResponse},
        422: {"model": ErrorResponse, "description": "invalid spec (field = dotted path)"},
        503: {
            "model": ErrorResponse,
            "description": "busy: every validation slot is taken "
            "(FEDTUNE_MAX_CONCURRENT_VALIDATIONS); retry after Retry-After seconds",
        },
        **_ERRORS,
    },
)
async def submit_study(
    request: Request,
    ctx: Ctx,
    caller: Caller,
    response: Response,
    spec: SpecBody,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="makes a retried submission return the first study (one that comes "
            "while the first one's code is checked waits for that check's answer)",
            max_length=128,
        ),
    ] = None,
) -> StudyDetail:
    """Queue a study. The spec is validated before the answer (422 names the dotted field),
    in a bounded pool of its own (503 ``busy`` with ``Retry-After`` when every slot is taken)."""
    pool = request.app.state.runtime.validation  # off the request thread pool, bounded
    study, created = await pool.run(services.submit_study, ctx, spec, idempotency_key, caller)
    if not created:
        response.status_code = 200
        response.headers["Idempotent-Replayed"] = "true"
    response.headers["Location"] = f"/v1/studies/{study.id}"
    return study


@router.get(
    "",
    response_model=StudyPage,
    responses={
        422: {"model": ErrorResponse, "description": "invalid parameter or page_token (field)"},
        **_ERRORS,
    },
)
def list_studies(
    ctx: Ctx,
    caller: Caller,
    state: Annotated[
        list[StudyState] | None, Query(description="only these states (repeat for several)")
    ] = None,
    project: Annotated[str | None, Query(max_length=63, description="only this project")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=1_000_000_000)] = 0,
    page_token: Annotated[
        str | None,
        Query(
            max_length=512,
            description="next_page_token of the previous page (same filters and order): "
            "continues after it, however deep, at the cost of one page",
        ),
    ] = None,
    order: Annotated[Order, Query(description="by creation time: desc (newest first) or asc")] = (
        Order.DESC
    ),
    include_total: Annotated[
        bool | None,
        Query(description="count the matching studies (default: on a first page only)"),
    ] = None,
) -> StudyPage:
    """The studies the caller may read, newest first (``order=asc``: oldest first). Page with
    ``page_token`` = the previous answer's ``next_page_token`` (keyset: as fast on page 200 as on
    page 1); ``offset`` still works and costs the rows it skips."""
    page = services.list_studies(
        ctx,
        state,
        limit,
        offset,
        caller=caller,
        project=project,
        page_token=page_token,
        order=order,
        include_total=include_total,
    )
    return _json(page)


@router.get("/{study_id}", response_model=StudyDetail, responses=_ERRORS)
def get_study(ctx: Ctx, caller: Caller, study_id: StudyId) -> StudyDetail:
    return _json(services.read_study(ctx, caller, study_id))  # access checked in one transaction


@router.post(
    "/{study_id}/cancel",
    response_model=StudyDetail,
    responses={409: {"model": ErrorResponse, "description": "already finished"}, **_ERRORS},
)
def cancel_study(ctx: Ctx, caller: Caller, study_id: StudyId) -> StudyDetail:
    services.authorize(ctx, caller, study_id, write=True)
    return services.cancel_study(ctx, study_id)


@router.get("/{study_id}/trials", response_model=list[TrialOut], responses=_ERRORS)
def list_trials(
    ctx: Ctx, caller: Caller, study_id: StudyId, state: TrialState | None = None
) -> list[TrialOut]:
    services.authorize(ctx, caller, study_id)
    return services.list_trials(ctx, study_id, state)


@router.get("/{study_id}/trials/{number}/curve", response_model=CurveOut, responses=_ERRORS)
def get_curve(ctx: Ctx, caller: Caller, study_id: StudyId, number: TrialNumber) -> CurveOut:
    services.authorize(ctx, caller, study_id)
    return services.get_curve(ctx, study_id, number)


@router.get("/{study_id}/tradeoff", response_model=TradeOff, responses=_ERRORS)
def get_tradeoff(ctx: Ctx, caller: Caller, study_id: StudyId) -> Response:
    """Once the study has ended: MLflow's ``tradeoff/tradeoff.json``, byte for byte."""
    services.authorize(ctx, caller, study_id)
    return Response(services.get_tradeoff(ctx, study_id), media_type="application/json")
