"""Comparisons of studies and studies of methods: ``GET``/``POST /v1/compare?studies=A,B``,
``POST /v1/methods``, ``GET /v1/methods/{group_id}``.

Handlers parse the request, call one service function and shape the answer.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Request, Response

from .. import comparisons
from ..schemas import Comparison, ErrorResponse, MethodGroupOut, MethodsOut, dump_json
from .auth import Caller
from .deps import Ctx
from .routes_studies import SpecBody

__all__ = ["router"]

router = APIRouter(tags=["studies"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorResponse, "description": "no bearer token"},
    404: {"model": ErrorResponse, "description": "a study does not exist or is not the caller's"},
    422: {
        "model": ErrorResponse,
        "description": "fewer than two studies, or studies of a different task, data or "
        "objective without force",
    },
}
Studies = Annotated[
    str, Query(max_length=2000, description="the study ids, comma-separated (2 or more)")
]
GroupId = Annotated[str, Path(max_length=32, description="the study of methods' id")]
Force = Annotated[bool, Query(description="compare studies of a different task, data or objective")]


@router.get("/v1/compare", response_model=Comparison, responses=_ERRORS)
def compare(ctx: Ctx, caller: Caller, studies: Studies, force: Force = False) -> Response:
    """Compare studies on one task: lower envelopes, budget curves, Pareto sets, predicted
    trade-offs and each study's best configuration at matched budgets (equal trials, equal
    total rounds). Every study must be readable by the caller (404 otherwise)."""
    answer = comparisons.compare_studies(ctx, caller, studies.split(","), force)
    return Response(json.dumps(answer.to_json(), allow_nan=False), media_type="application/json")


@router.post(
    "/v1/compare",
    response_model=Comparison,
    responses={403: {"model": ErrorResponse, "description": "a viewer of a study"}, **_ERRORS},
)
def record_comparison(ctx: Ctx, caller: Caller, studies: Studies, force: Force = False) -> Response:
    """As ``GET``, and record the comparison as an MLflow run (artifacts PNG, HTML, JSON, CSV)
    linked with the studies' parent runs. The caller must be allowed to change every study."""
    answer = comparisons.compare_studies(ctx, caller, studies.split(","), force, record=True)
    return Response(json.dumps(answer.to_json(), allow_nan=False), media_type="application/json")


@router.post(
    "/v1/methods",
    status_code=201,
    response_model=MethodsOut,
    responses={
        403: {"model": ErrorResponse, "description": "a viewer of the project"},
        409: {
            "model": ErrorResponse,
            "description": "Idempotency-Key reused with another body; or submission_in_progress "
            "(with Retry-After): another request with the key is still having its code checked",
        },
        422: {"model": ErrorResponse, "description": "invalid list or spec (field)"},
        401: {"model": ErrorResponse, "description": "no bearer token"},
    },
)
async def submit_methods(
    request: Request,
    ctx: Ctx,
    caller: Caller,
    spec: SpecBody,
    idempotency_key: Annotated[
        str | None,
        Header(description="makes a retried submission return the same studies", max_length=120),
    ] = None,
) -> Response:
    """Queue a study of methods: a spec whose ``algorithm`` lists algorithms (each a name or
    ``{name, search}``) becomes one study per algorithm, same task, seed and budget; every
    spec is validated before any study is queued. Compare them with ``compare_url``."""
    pool = request.app.state.runtime.validation
    answer = await pool.run(comparisons.submit_methods, ctx, spec, idempotency_key, caller)
    return Response(dump_json(MethodsOut(**answer)), status_code=201, media_type="application/json")


@router.get(
    "/v1/methods/{group_id}",
    response_model=MethodGroupOut,
    responses={
        401: {"model": ErrorResponse, "description": "no bearer token"},
        404: {"model": ErrorResponse, "description": "no such study of methods for the caller"},
    },
)
def get_methods(ctx: Ctx, caller: Caller, group_id: GroupId) -> Response:
    """A study of methods: its studies' states and, once every one has ended, the MLflow run of
    their comparison (recorded by the service's scheduler)."""
    answer = comparisons.get_method_group(ctx, caller, group_id)
    return Response(dump_json(answer), media_type="application/json")
