"""``/healthz`` (process up), ``/readyz`` (database reachable), ``/metrics`` (Prometheus:
aggregate series to anyone, the per-project ones with the scrape token, ``.metrics``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from .. import meta_services as services
from ..schemas import ErrorResponse, Health, Readiness
from .deps import Ctx
from .metrics import exposition, scrape_scope

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": ErrorResponse}})
def readyz(ctx: Ctx) -> Readiness:
    return services.readiness(ctx)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, 401: {"model": ErrorResponse}},
)
def metrics(
    request: Request,
    authorization: Annotated[
        str | None,
        Header(
            description="`Bearer <FEDTUNE_METRICS_TOKEN>` adds the per-project series "
            "(`fedtune_project_*`); without it, only the series that name no project"
        ),
    ] = None,
) -> Response:
    runtime = request.app.state.runtime
    token = runtime.settings.metrics_token
    per_project = scrape_scope(token.get_secret_value() if token else None, authorization)
    body = exposition(runtime.registry, runtime.ctx, per_project)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
