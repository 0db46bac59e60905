"""Prometheus metrics of the service, in a registry of its own (one per app).

Every scrape gets the aggregate series below, which name no project. The per-project series
(``fedtune_project_*{project}``: reservations, usage and quotas) name every project, so they go
only to a scrape that sends ``Authorization: Bearer <FEDTUNE_METRICS_TOKEN>``
(:func:`scrape_scope`); a scrape with another token is 401, one without a token gets the
aggregate series alone. ``docs/explanation/threat-model.md`` says why.

* ``fedtune_studies{state}`` — studies by state; ``fedtune_queue_length`` — queued studies;
  ``fedtune_trials_running`` — running trials of running studies; ``fedtune_database_up``.
  Read from the database at every scrape (a custom collector: always current, no bookkeeping).
* ``fedtune_backend_up{backend}`` — 1 while the execution backend can launch studies, 0 while
  it refuses the service's credentials or does not answer (``backend_health``; absent without
  a scheduler or before the backend was ever reached).
* ``fedtune_http_requests_total{method,route,status}`` and
  ``fedtune_http_request_duration_seconds{method,route}`` (route = the path template, never a
  path with a name in it).
* with the scrape token, per project: ``fedtune_project_reserved_gpus``,
  ``…_reserved_trials``, ``…_gpu_hours``, ``…_studies_queued``, ``…_studies_running`` and the
  quotas ``…_quota_gpus``, ``…_quota_trials``, ``…_quota_studies``, ``…_quota_gpu_hours``
  (absent when unlimited).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fedtune.errors import FedtuneError

from ..errors import InvalidTokenError
from ..meta_services import metrics_snapshot, project_metrics
from ..services import ServiceContext
from ..states import StudyState
from .auth import bearer_token

__all__ = [
    "HttpMetrics",
    "ProjectCollector",
    "StudyCollector",
    "exposition",
    "make_registry",
    "scrape_scope",
]


def scrape_scope(metrics_token: str | None, authorization: str | None) -> bool:
    """Whether a scrape may see the per-project series.

    Args:
        metrics_token: ``FEDTUNE_METRICS_TOKEN`` (None: no scrape sees them).
        authorization: the request's ``Authorization`` header, if any.

    Returns:
        True for ``Bearer <metrics_token>``; False without a header.

    Raises:
        UnauthorizedError: a header that is not a bearer token.
        InvalidTokenError: another token than ``metrics_token`` (or any, when it is unset).
    """
    if not authorization:
        return False
    token = bearer_token(authorization)
    if metrics_token is None or not hmac.compare_digest(token.encode(), metrics_token.encode()):
        raise InvalidTokenError(
            "the bearer token is not the scrape token (FEDTUNE_METRICS_TOKEN); without a token "
            "/metrics answers the series that name no project"
        )
    return True


def exposition(registry: CollectorRegistry, ctx: ServiceContext, per_project: bool) -> bytes:
    """The text a scrape gets: ``registry``'s series, then, when ``per_project``, the
    per-project ones (read from the database only then).

    Args:
        registry: the app's registry (aggregate series only).
        ctx: the service context.
        per_project: the scrape sent the scrape token (:func:`scrape_scope`).

    Returns:
        Prometheus' text format.
    """
    text = generate_latest(registry)
    if per_project:
        projects = CollectorRegistry(auto_describe=False)
        projects.register(ProjectCollector(ctx))
        text += generate_latest(projects)
    return text


class StudyCollector:
    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        yield from _backend_gauge(self.ctx)
        try:
            snap = metrics_snapshot(self.ctx)
        except FedtuneError:
            yield GaugeMetricFamily("fedtune_database_up", "Database reachable", value=0)
            return
        yield GaugeMetricFamily("fedtune_database_up", "Database reachable", value=1)
        studies = GaugeMetricFamily("fedtune_studies", "Studies by state", labels=["state"])
        for state in StudyState:
            studies.add_metric([str(state)], snap["studies"].get(str(state), 0))
        yield studies
        yield GaugeMetricFamily(
            "fedtune_trials_running",
            "Running trials of running studies",
            value=snap["trials_running"],
        )
        yield GaugeMetricFamily(
            "fedtune_queue_length", "Studies waiting for a driver", value=snap["queue_length"]
        )
        scheduler = self.ctx.stopper  # the scheduler, when this process runs one
        leads = bool(getattr(scheduler, "leading", False))
        yield GaugeMetricFamily(
            "fedtune_scheduler_leader", "1 when this replica runs the scheduler", value=int(leads)
        )


def _backend_gauge(ctx: ServiceContext) -> Iterator[Metric]:
    """``fedtune_backend_up{backend}`` from the scheduler's backend health (probed if stale)."""
    health = getattr(ctx.stopper, "health", None)
    if health is None:
        return
    gauge = GaugeMetricFamily(
        "fedtune_backend_up",
        "1 when the execution backend can launch studies, 0 when it refuses or does not answer",
        labels=["backend"],
    )
    up = health.current().up
    if up is not None:
        gauge.add_metric([health.kind], int(up))
    yield gauge


#: (metric, help, key in the snapshot) of the per-project gauges
_PROJECT_GAUGES = (
    ("fedtune_project_reserved_gpus", "GPUs the project's running studies reserve", "gpus"),
    (
        "fedtune_project_reserved_trials",
        "Concurrent trials the project's studies reserve",
        "trials",
    ),
    (
        "fedtune_project_gpu_hours",
        "GPU-hours the project's studies used in the fair-share window or may still use",
        "gpu_hours",
    ),
    ("fedtune_project_studies_queued", "The project's studies waiting", "queued"),
    ("fedtune_project_studies_running", "The project's studies running", "running"),
    ("fedtune_project_quota_gpus", "The project's GPU quota (absent: unlimited)", "quota_gpus"),
    (
        "fedtune_project_quota_trials",
        "The project's trial quota (absent: unlimited)",
        "quota_trials",
    ),
    (
        "fedtune_project_quota_studies",
        "The project's active-study quota (absent: unlimited)",
        "quota_studies",
    ),
    (
        "fedtune_project_quota_gpu_hours",
        "The project's GPU-hour quota per fair-share window (absent: unlimited)",
        "quota_gpu_hours",
    ),
)


class ProjectCollector:
    """The per-project gauges (:data:`_PROJECT_GAUGES`), for a scrape with the scrape token."""

    def __init__(self, ctx: ServiceContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        try:
            projects = project_metrics(self.ctx)
        except FedtuneError:
            return  # fedtune_database_up says so
        yield from _project_gauges(projects)


def _project_gauges(projects: dict) -> Iterator[Metric]:
    for name, text, key in _PROJECT_GAUGES:
        gauge = GaugeMetricFamily(name, text, labels=["project"])
        for project, values in sorted(projects.items()):
            if values.get(key) is not None:
                gauge.add_metric([project], float(values[key]))
        yield gauge


def make_registry(ctx: ServiceContext) -> tuple[CollectorRegistry, Counter, Histogram]:
    registry = CollectorRegistry()
    registry.register(StudyCollector(ctx))
    requests = Counter(
        "fedtune_http_requests", "HTTP requests", ["method", "route", "status"], registry=registry
    )
    latency = Histogram(
        "fedtune_http_request_duration_seconds",
        "HTTP request latency",
        ["method", "route"],
        registry=registry,
    )
    return registry, requests, latency


class HttpMetrics:
    """Pure ASGI middleware counting requests by route template (not by raw path)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        started = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            runtime = getattr(scope["app"].state, "runtime", None)
            route = getattr(scope.get("route"), "path", "<unmatched>")
            if runtime is not None:
                runtime.requests.labels(scope["method"], route, str(status)).inc()
                runtime.latency.labels(scope["method"], route).observe(
                    time.perf_counter() - started
                )
