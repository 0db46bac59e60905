"""User code packages: upload one (bearer token), and a study's package for its RayJob
(per-study credential in the query, see ``fedtune/service/code_url.py``)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from fedtune.errors import ForbiddenError, NotFoundError

from .. import code_services
from ..access import default_project
from ..schemas import CodeOut, ErrorResponse
from .auth import Caller
from .deps import Ctx

__all__ = ["router"]

router = APIRouter(tags=["code"])
_ZIP = {"content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}}}


@router.post(
    "/v1/code",
    status_code=201,
    response_model=CodeOut,
    openapi_extra={"requestBody": {"required": True, **_ZIP}},
    responses={
        200: {"model": CodeOut, "description": "this project uploaded identical code before"},
        403: {"model": ErrorResponse, "description": "uploads disabled, or a viewer uploading"},
        404: {"model": ErrorResponse, "description": "no such project of the caller's"},
        413: {"model": ErrorResponse, "description": "over FEDTUNE_MAX_CODE_BYTES"},
        422: {"model": ErrorResponse, "description": "not a zip, or unsafe entries"},
    },
)
async def upload_code(
    ctx: Ctx,
    caller: Caller,
    request: Request,
    response: Response,
    project: Annotated[
        str | None,
        Query(
            max_length=63,
            description="the project it is for (default: the project a study "
            "naming none goes to: the caller's only one; an admin's: default)",
        ),
    ] = None,
) -> Any:
    """Store a zip of user code under its SHA-256 for ``project`` (then submit a spec of that
    project naming ``code.sha256``; another project's studies cannot use it: it uploads it too)."""
    if project is None:
        project = default_project(caller)
    if not caller.can_read(project):
        raise NotFoundError(f"no project {project!r}")
    if not caller.can_write(project):
        raise ForbiddenError(f"{caller.name} is a viewer of project {project!r}: reading only")
    data = await request.body()
    out = await run_in_threadpool(code_services.upload_code, ctx, data, project)
    if not out.created:
        response.status_code = 200
    return out


@router.get(
    "/v1/studies/{study_id}/code.zip",
    response_class=Response,
    responses={
        200: _ZIP,
        404: {
            "model": ErrorResponse,
            "description": "no such study with code, or a wrong "
            "code token (the same answer: no existence oracle)",
        },
    },
)
def study_code(
    ctx: Ctx,
    study_id: Annotated[str, Path(max_length=64)],
    token: Annotated[str, Query(min_length=1, max_length=128)],
) -> Response:
    """A study's code package for its RayJob's ``working_dir`` (one top-level folder)."""
    data = code_services.study_code_zip(ctx, study_id, token)
    return Response(data, media_type="application/zip", headers={"Cache-Control": "no-store"})
