"""The FastAPI application: ``create_app(settings) -> FastAPI``.

At start (lifespan): open the database, apply the Alembic migrations (or, with
``FEDTUNE_MIGRATE_ON_START=false``, refuse a schema that is not at head), build the configured
backend, reconcile running studies with their drivers, start the scheduler, and load the tuning
stack in a thread (``/readyz`` answers 503 ``warming_up`` until then; ``service/warmup.py``). At shutdown: stop
the scheduler and close the backend (the local backend stops its child drivers; their studies
resume on the next start). Routes: ``/healthz``, ``/readyz``, ``/metrics`` (open; its
per-project series only with ``FEDTUNE_METRICS_TOKEN``), ``/client/`` (the light client's
wheel, open: ``routes_client.py``) and the API
under ``/v1`` (bearer token when ``FEDTUNE_API_TOKEN`` is set); OpenAPI at ``/openapi.json``,
docs at ``/docs``. Request bodies above ``FEDTUNE_MAX_REQUEST_BYTES`` are answered 413;
submissions are validated in a bounded pool of their own (``pool.py``; 503 ``busy`` when full).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from fastapi import FastAPI
from prometheus_client import CollectorRegistry, Counter, Histogram

from fedtune.tuning.common import start_gc
from fedtune.tuning.mlflow.client import kill_study_runs

from ..backends import Backend, make_backend
from ..code_services import code_sandbox_state, require_code_sandbox
from ..comparisons import record_ended_groups
from ..db import Database
from ..leader import make_leadership
from ..migrate import require_current_schema, upgrade_database
from ..mlflow_sync import TenancyLoop, tenancy_from_settings
from ..oidc import OidcConfig, OidcVerifier, looks_like_jwt
from ..reconcile import reconcile_running
from ..scheduler import Scheduler
from ..services import ServiceContext
from ..settings import Settings, load_settings
from ..warmup import Warmup
from . import (
    routes_admin,
    routes_client,
    routes_code,
    routes_compare,
    routes_driver,
    routes_health,
    routes_meta,
    routes_studies,
)
from .allow import AllowedMethods
from .auth import BearerAuth
from .errors import install_error_handlers
from .limits import BodySizeLimit
from .metrics import HttpMetrics, make_registry
from .openapi import install_openapi
from .pool import ValidationPool

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
    validation: ValidationPool  # where submissions are validated (pool.py)
    #: keeps MLflow's workspaces and roles in step with projects (``mlflow_sync.py``)
    tenancy: TenancyLoop | None = None

    @classmethod
    def start(
        cls, settings: Settings, backend: Backend | None, *, migrate: bool, schedule: bool
    ) -> Runtime:
        db = Database(settings.database_url)
        if migrate and settings.migrate_on_start:
            revision = upgrade_database(db)
            log.info("database at revision %s (%s)", revision, db.dialect)
        elif migrate:
            log.info("database at revision %s (%s)", require_current_schema(db), db.dialect)
        scheduler = None
        tenancy = None
        mlflow = tenancy_from_settings(settings)
        if mlflow is not None:
            tenancy = TenancyLoop(db, mlflow, settings.mlflow_sync_s, settings.mlflow_oidc_login_s)
            if schedule:
                tenancy.start()
        if backend is not None:
            leadership = make_leadership(db, settings) if schedule else None
            fence = leadership.hold() if leadership is not None else None
            if leadership is None or fence is not None:  # the leader reconciles, no one else
                recovered = reconcile_running(db, backend, settings.max_dispatch_attempts, fence)
                for item in recovered:
                    log.warning("reconciled study %s: %s", item.study_id, item.action)
            scheduler = Scheduler(
                db,
                backend,
                settings,
                kill_runs=kill_study_runs,
                leadership=leadership,
                before_launch=tenancy.before_launch if tenancy is not None else None,
                after_tick=partial(record_ended_groups, ServiceContext(db=db, settings=settings)),
            )
            if schedule:
                scheduler.start()
        warmup = Warmup()
        warmup.start()
        ctx = ServiceContext(
            db=db, settings=settings, stopper=scheduler, warmup=warmup, tenancy=tenancy
        )
        registry, requests, latency = make_registry(ctx)
        validation = ValidationPool(settings.max_concurrent_validations, settings.validation_queue)
        return cls(
            settings, db, backend, scheduler, ctx, registry, requests, latency, validation, tenancy
        )

    def close(self) -> None:
        self.validation.close()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.tenancy is not None:
            self.tenancy.stop()
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
    require_code_sandbox(settings)  # one line, before anything starts
    if code_sandbox_state(settings) not in (None, "bwrap"):
        log.warning("FEDTUNE_CODE_SANDBOX=none: %s", code_sandbox_state(settings))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        chosen = make_backend(settings) if backend is _DEFAULT else backend
        runtime = Runtime.start(settings, chosen, migrate=migrate, schedule=schedule)
        app.state.runtime = runtime
        start_gc.resume()  # fedtune serve's start is over (paused by it; else nothing)
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
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_request_bytes,
        per_path={"/v1/code": (settings.max_code_bytes, "code")},
    )
    oidc = OidcConfig.from_settings(settings)
    app.add_middleware(
        BearerAuth,
        token=settings.token,
        resolve=token_resolver(app, oidc),
        required=settings.token is not None or oidc is not None,
    )  # 401 first
    app.add_middleware(AllowedMethods)  # OPTIONS: before authentication, like a preflight
    app.add_middleware(HttpMetrics)
    install_error_handlers(app)
    install_openapi(app, settings)
    for module in (
        routes_health,
        routes_studies,
        routes_compare,
        routes_code,
        routes_meta,
        routes_admin,
        routes_driver,
        routes_client,
    ):  # one per resource
        app.include_router(module.router)
    return app


def token_resolver(app: FastAPI, oidc: OidcConfig | None = None):
    """A bearer token -> its caller: an OIDC JWT verified against the issuer's keys, else a
    user's API token looked up in the service database."""
    verifier = OidcVerifier(oidc) if oidc is not None else None

    def resolve(token: str):
        from ..identity import principal_for_token

        if verifier is not None and looks_like_jwt(token):
            return verifier.principal(token)
        with app.state.runtime.ctx.db.session(readonly=True) as session:
            return principal_for_token(session, token)

    return resolve


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fedtune")
    except PackageNotFoundError:
        return "0.0.0"
