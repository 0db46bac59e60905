"""Service functions of discovery (algorithms, tasks, search spaces), readiness and metrics."""

from __future__ import annotations

import functools
from typing import Any

from .errors import ServiceWarmingUpError
from .repository import Repository
from .schemas import AlgorithmOut, Readiness, SearchSpaceOut, TaskOut
from .services import ServiceContext
from .states import StudyState

__all__ = [
    "list_algorithms",
    "list_search_spaces",
    "list_tasks",
    "metrics_snapshot",
    "readiness",
]


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
    """Raises ``DatabaseUnavailableError`` (503) unless the database answers, and
    ``ServiceWarmingUpError`` (503) until the tuning stack is loaded (a submission is fast)."""
    from .migrate import current_revision

    if ctx.warmup is not None and not ctx.warmup.done.is_set():
        raise ServiceWarmingUpError("loading the tuning stack; submissions would be slow")
    ctx.db.ping()
    revision = current_revision(ctx.db.engine)
    return Readiness(status="ready", database=ctx.db.dialect, revision=revision)


def metrics_snapshot(ctx: ServiceContext) -> dict[str, Any]:
    """Studies by state, running trials and queue length (read at every /metrics scrape)."""
    with ctx.db.session(readonly=True) as session:
        repo = Repository(session)
        by_state = repo.count_by_state()
        running_trials = repo.running_trials_total()
    return {
        "studies": {str(k): v for k, v in by_state.items()},
        "trials_running": running_trials,
        "queue_length": by_state[StudyState.QUEUED],
    }
