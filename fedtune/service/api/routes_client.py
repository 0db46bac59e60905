"""``/client/``: the light client's wheel for members' laptops (no token: it is public code).

* ``GET /client/`` — a page listing the wheels with their SHA-256 and the ``pip install`` lines;
  pip reads it as a ``--find-links`` page (``pip install --find-links http://<service>/client/
  fedtune``: the wheel from here, its dependencies from the member's index);
* ``GET /client/simple/`` and ``GET /client/simple/fedtune/`` — the same as a PEP 503 index
  (``pip install --extra-index-url http://<service>/client/simple/ fedtune``);
* ``GET /client/<wheel>`` — the wheel itself, by its exact file name
  (``pip install http://<service>/client/fedtune-<version>-py3-none-any.whl``).

Every route answers 404 with the reason when no wheel is built; only the wheels of
``fedtune.service.client_wheel`` are served.
"""

from __future__ import annotations

import html
import logging

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, HTMLResponse

from fedtune.errors import NotFoundError

from ..client_wheel import NONE_BUILT, Wheel, find_wheel, wheel_dir, wheels
from ..schemas import ErrorResponse

__all__ = ["router"]

log = logging.getLogger(__name__)

router = APIRouter(prefix="/client", tags=["client"])
#: what the pages answer: HTML, or a JSON error (``response_class=Response``: FastAPI would
#: otherwise document the error under the page's media type)
_PAGE = {200: {"content": {"text/html": {}}}, 404: {"model": ErrorResponse}}
#: the project's name on the PEP 503 index (normalised)
PROJECT = "fedtune"


def _available(request: Request) -> list[Wheel]:
    """The wheels to list, or 404 with the reason (the folder is logged, not answered)."""
    directory = wheel_dir(request.app.state.settings)
    found = wheels(directory)
    if not found:
        log.info("GET %s: no client wheel in %s (make dist)", request.url.path, directory)
        raise NotFoundError(NONE_BUILT)
    return found


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        "<!DOCTYPE html>\n<html><head><meta name='pypi:repository-version' content='1.0'>"
        f"<title>{html.escape(title)}</title></head>\n<body>\n{body}</body></html>\n"
    )


def _links(found: list[Wheel], prefix: str = "") -> str:
    return "".join(
        f'<a href="{prefix}{html.escape(w.name)}#sha256={w.sha256}">{html.escape(w.name)}</a><br>\n'
        for w in found
    )


@router.get("/", response_class=Response, responses=_PAGE, summary="The client's wheels")
def index(request: Request) -> HTMLResponse:
    found = _available(request)
    base = html.escape(str(request.base_url).rstrip("/") + "/client/")
    newest = html.escape(found[-1].name)
    body = (
        "<h1>fedtune: the light client</h1>\n"
        "<p>The SDK and the service's client verbs (no PyTorch, Ray or MLflow). Install it with "
        "either line; pip takes its dependencies from your own index:</p>\n"
        f"<pre>pip install {base}{newest}\npip install --find-links {base} fedtune</pre>\n"
        f"{_links(found)}"
    )
    return _page("fedtune client", body)


@router.get("/simple/", response_class=Response, responses=_PAGE, summary="PEP 503 root")
def simple_root(request: Request) -> HTMLResponse:
    _available(request)
    return _page("Simple index", f'<a href="{PROJECT}/">{PROJECT}</a><br>\n')


@router.get(
    "/simple/{project}/",
    response_class=Response,
    responses=_PAGE,
    summary="PEP 503 project page",
)
def simple_project(request: Request, project: str) -> HTMLResponse:
    if project.lower().replace("_", "-").replace(".", "-") != PROJECT:
        raise NotFoundError(f"this index has one project, {PROJECT}")
    return _page(f"Links for {PROJECT}", _links(_available(request), prefix="../../"))


@router.get(
    "/{filename}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}}, 404: {"model": ErrorResponse}},
    summary="A wheel, by its file name",
)
def wheel(request: Request, filename: str) -> FileResponse:
    found = find_wheel(wheel_dir(request.app.state.settings), filename)
    return FileResponse(found.path, media_type="application/octet-stream", filename=found.name)
