"""``/healthz`` (process up), ``/readyz`` (database reachable), ``/metrics`` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .. import meta_services as services
from ..schemas import ErrorResponse, Health, Readiness
from .deps import Ctx

__all__ = ["router"]

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses={503: {"model": ErrorResponse}})
def readyz(ctx: Ctx) -> Readiness:
    return services.readiness(ctx)


@router.get(
    "/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}}
)
def metrics(request: Request) -> Response:
    registry = request.app.state.runtime.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
