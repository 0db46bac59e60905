"""Service functions of discovery (algorithms, tasks, search spaces), readiness and metrics."""

from __future__ import annotations

import functools
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from .errors import ServiceWarmingUpError, WorkdirUnwritableError
from .repository import Repository
from .schemas import (
    AlgorithmOut,
    BackendReadiness,
    MlflowReadiness,
    Readiness,
    SearchSpaceOut,
    TaskOut,
)
from .services import ServiceContext
from .states import StudyState

__all__ = [
    "check_writable",
    "list_algorithms",
    "list_search_spaces",
    "list_tasks",
    "metrics_snapshot",
    "readiness",
]

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------ discovery


def list_algorithms() -> list[AlgorithmOut]:
    from fedtune.trainers import algorithms

    return [AlgorithmOut(**r.describe()) for _, r in sorted(algorithms().items())]


def list_tasks() -> list[TaskOut]:
    from fedtune.trainers import tasks

    return [TaskOut(name=t.name, description=t.description) for _, t in sorted(tasks().items())]


@functools.cache
def _shipped_spaces() -> tuple[SearchSpaceOut, ...]:
    from fedtune.search_spaces import shipped_spaces

    return tuple(SearchSpaceOut(**s.to_dict()) for s in shipped_spaces().values())


def list_search_spaces() -> list[SearchSpaceOut]:
    """The shipped spaces (read once: they are package data)."""
    return list(_shipped_spaces())


# ------------------------------------------------------------------------ health, metrics


def readiness(ctx: ServiceContext) -> Readiness:
    """Raises ``DatabaseUnavailableError`` (503) unless the database answers,
    ``ServiceWarmingUpError`` (503) until the tuning stack is loaded (a submission is fast), and
    ``WorkdirUnwritableError`` (503) while the work directory cannot take a byte (full disk:
    studies' stores, logs and code live there).

    A backend that cannot launch studies (its credentials refused, its address unreachable:
    ``backend_health``) does not make the replica unready — it still serves reads, submissions
    and cancellations, and taking every replica out of its Service would hide the reason — so
    the answer stays 200, with ``status: degraded`` and ``backend: {up: false, reason}``. So
    does a failing sync of MLflow's workspaces, users and roles (``mlflow: {up: false, reason}``:
    MLflow refuses the service's Host header or login, or does not answer)."""
    from .admin_token import auth_mode
    from .code_services import code_sandbox_state
    from .migrate import current_revision

    if ctx.warmup is not None and not ctx.warmup.done.is_set():
        raise ServiceWarmingUpError("loading the tuning stack; submissions would be slow")
    check_writable(Path(ctx.settings.workdir))
    ctx.db.ping()
    revision = current_revision(ctx.db.engine)
    backend = backend_readiness(ctx)
    mlflow = mlflow_readiness(ctx)
    down = [part for part in (backend, mlflow) if part is not None and part.up is False]
    status = "degraded" if down else "ready"
    return Readiness(
        status=status,
        database=ctx.db.dialect,
        revision=revision,
        backend=backend,
        auth=auth_mode(ctx.settings),
        code_sandbox=code_sandbox_state(ctx.settings),
        mlflow=mlflow,
    )


def backend_readiness(ctx: ServiceContext) -> BackendReadiness | None:
    """The backend's state as the scheduler observed it, probed when that is stale.

    Args:
        ctx: the service context (its ``stopper`` is the scheduler, when one runs).

    Returns:
        Kind, up and reason; None without a scheduler (backend ``none``).
    """
    health = getattr(ctx.stopper, "health", None)
    if health is None:
        return None
    state = health.current()
    return BackendReadiness(kind=health.kind, up=state.up, reason=state.reason)


def mlflow_readiness(ctx: ServiceContext) -> MlflowReadiness | None:
    """The MLflow tenancy's last sync (``mlflow_sync.TenancyLoop.health``).

    Args:
        ctx: the service context.

    Returns:
        Up and reason; None without ``FEDTUNE_MLFLOW_WORKSPACES``.
    """
    loop = ctx.tenancy
    if loop is None:
        return None
    return MlflowReadiness(up=loop.health.up, reason=loop.health.reason)


def check_writable(workdir: Path) -> None:
    """Write, flush to disk and remove one byte in ``workdir`` (created if missing); else
    ``WorkdirUnwritableError`` with the system's reason (the path is logged, never answered:
    ``/readyz`` is open)."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=workdir, prefix=".ready-") as probe:
            probe.write(b"\0")
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        log.warning("work directory %s cannot be written: %s", workdir, exc)
        raise WorkdirUnwritableError(
            f"the work directory (FEDTUNE_WORKDIR) cannot be written: {exc.strerror or exc}"
        ) from None


def metrics_snapshot(ctx: ServiceContext) -> dict[str, Any]:
    """Studies by state, running trials and queue length (read at every /metrics scrape)."""
    from .identity import projects
    from .project_usage import project_usage

    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        by_state = repo.count_by_state()
        running_trials = repo.running_trials_total()
        usage = {
            p.name: (p, project_usage(session, p.name, ctx.settings)) for p in projects(session)
        }
    return {
        "studies": {str(k): v for k, v in by_state.items()},
        "trials_running": running_trials,
        "queue_length": by_state[StudyState.QUEUED],
        "projects": {name: _project_figures(p, u) for name, (p, u) in usage.items()},
    }


def _project_figures(project: Any, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "gpus": usage["gpus"],
        "trials": usage["trials"],
        "gpu_hours": usage["gpu_hours"],
        "queued": usage["studies"]["queued"],
        "running": usage["studies"]["running"],
        "quota_gpus": project.quota_gpus,
        "quota_trials": project.quota_trials,
        "quota_studies": project.quota_studies,
        "quota_gpu_hours": project.quota_gpu_hours,
    }
