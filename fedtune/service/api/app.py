"""The FastAPI application: ``create_app(settings) -> FastAPI``.

At start (lifespan): open the database, apply the Alembic migrations, build the configured
backend, reconcile running studies with their drivers, start the scheduler. At shutdown: stop
the scheduler and close the backend (the local backend stops its child drivers; their studies
resume on the next start). Routes: ``/healthz``, ``/readyz``, ``/metrics`` (open) and the API
under ``/v1`` (bearer token when ``FEDTUNE_API_TOKEN`` is set); OpenAPI at ``/openapi.json``,
docs at ``/docs``. Request bodies above ``FEDTUNE_MAX_REQUEST_BYTES`` are answered 413.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram

from ..backends import Backend, make_backend
from ..db import Database
from ..migrate import upgrade_database
from ..reconcile import reconcile_running
from ..scheduler import Scheduler
from ..services import ServiceContext
from ..settings import Settings, load_settings
from ..tracking import kill_runs
from . import routes_health, routes_meta, routes_studies
from .errors import install_error_handlers
from .limits import BodySizeLimit
from .metrics import HttpMetrics, make_registry

__all__ = ["Runtime", "create_app"]

log = logging.getLogger(__name__)
_DEFAULT: Any = object()


@dataclass
class Runtime:
    """What the running app holds: database, backend, scheduler, metrics."""

    settings: Settings
    db: Database
    backend: Backend | None
    scheduler: Scheduler | None
    ctx: ServiceContext
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram

    @classmethod
    def start(
        cls, settings: Settings, backend: Backend | None, *, migrate: bool, schedule: bool
    ) -> Runtime:
        db = Database(settings.database_url)
        if migrate:
            revision = upgrade_database(db)
            log.info("database at revision %s (%s)", revision, db.dialect)
        scheduler = None
        if backend is not None:
            recovered = reconcile_running(db, backend, settings.max_dispatch_attempts)
            for item in recovered:
                log.warning("reconciled study %s: %s", item.study_id, item.action)
            scheduler = Scheduler(db, backend, settings, kill_runs=kill_runs)
            if schedule:
                scheduler.start()
        ctx = ServiceContext(db=db, settings=settings, stopper=scheduler)
        registry, requests, latency = make_registry(ctx)
        return cls(settings, db, backend, scheduler, ctx, registry, requests, latency)

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.backend is not None:
            self.backend.close()
        self.db.dispose()


def create_app(
    settings: Settings | None = None,
    *,
    backend: Backend | None = _DEFAULT,
    migrate: bool = True,
    schedule: bool = True,
) -> FastAPI:
    """The service app. ``backend`` defaults to ``FEDTUNE_BACKEND``'s (tests inject fakes);
    ``schedule=False`` builds the scheduler without its thread (tests call ``tick()``)."""
    settings = settings or load_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        chosen = make_backend(settings) if backend is _DEFAULT else backend
        runtime = Runtime.start(settings, chosen, migrate=migrate, schedule=schedule)
        app.state.runtime = runtime
        try:
            yield
        finally:
            runtime.close()

    app = FastAPI(
        title="fedtune",
        summary="Hyperparameter tuning for local-update federated and meta-learning methods",
        version=_version(),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    app.add_middleware(HttpMetrics)
    install_error_handlers(app)
    for module in (routes_health, routes_studies, routes_meta):  # one router per resource
        app.include_router(module.router)
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedtune")
    except PackageNotFoundError:
        return "0.0.0"
