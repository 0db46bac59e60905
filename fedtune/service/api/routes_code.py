"""User code packages: upload one (bearer token), and a study's package for its RayJob
(per-study credential in the query, see ``fedtune/service/code_url.py``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from .. import code_services
from ..schemas import CodeOut, ErrorResponse
from .auth import require_token
from .deps import Ctx

__all__ = ["router"]

router = APIRouter(tags=["code"])
_ZIP = {"content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}}}


@router.post(
    "/v1/code",
    status_code=201,
    response_model=CodeOut,
    dependencies=[Depends(require_token)],
    openapi_extra={"requestBody": {"required": True, **_ZIP}},
    responses={
        200: {"model": CodeOut, "description": "identical code was stored before"},
        403: {"model": ErrorResponse, "description": "uploads disabled, or wrong token"},
        413: {"model": ErrorResponse, "description": "over FEDTUNE_MAX_CODE_BYTES"},
        422: {"model": ErrorResponse, "description": "not a zip, or unsafe entries"},
    },
)
async def upload_code(ctx: Ctx, request: Request, response: Response) -> Any:
    """Store a zip of user code under its SHA-256 (then submit a spec naming code.sha256)."""
    data = await request.body()
    out = await run_in_threadpool(code_services.upload_code, ctx, data)
    if not out.created:
        response.status_code = 200
    return CodeOut(sha256=out.sha256, size=out.size, created=out.created)


@router.get(
    "/v1/studies/{study_id}/code.zip",
    response_class=Response,
    responses={
        200: _ZIP,
        403: {"model": ErrorResponse, "description": "wrong code token"},
        404: {"model": ErrorResponse, "description": "no such study with code"},
    },
)
def study_code(
    ctx: Ctx,
    study_id: Annotated[str, Path(max_length=64)],
    token: Annotated[str, Query(min_length=1, max_length=128)],
) -> Response:
    """A study's code package for its RayJob's ``working_dir`` (one top-level folder)."""
    data = code_services.study_code_zip(ctx, study_id, token)
    return Response(data, media_type="application/zip",
                    headers={"Cache-Control": "no-store"})  # fmt: skip
