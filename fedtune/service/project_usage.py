"""What a project uses now, against its quota (``GET /v1/projects/{p}``, ``/metrics``).

A study *reserves* what it may use at once, from its dispatch until it ends:
``processes × resources.gpu`` GPUs, where ``processes`` is the trial processes it holds at once
(:func:`~fedtune.tuning.packing.plan.reserved_processes`: ``budget.max_concurrent``, or
``ceil(max_concurrent / P)`` for a study packing an integer ``resources.pack`` = P
configurations per process), and ``budget.max_concurrent`` trials (configurations, packed or
not). A queued or running study is *active*. Read from the studies table (its spec), so every
replica answers the same; :func:`reservation` is the one place that computes a reservation
(admission, the scheduler's claim and the usage shown here all call it).

A project's *GPU-hours* (its ``quota_gpu_hours``) are counted over the fair-share window
(``FEDTUNE_FAIR_SHARE_WINDOW_S``): the GPU-seconds its studies used within the window, plus what
each running study may still use (its GPUs × what is left of its :func:`time_limit_s`).
:func:`gpu_hour_charge` is the one place that counts them.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from fedtune.tuning.packing.plan import reserved_processes

from .models import Study
from .specs import stored_spec_of
from .states import StudyState

if TYPE_CHECKING:
    from fedtune.tuning.spec import StoredSpec

    from .settings import Settings

__all__ = [
    "gpu_hour_charge",
    "project_usage",
    "recent_studies",
    "reservation",
    "time_limit_s",
    "trial_processes",
]


def trial_processes(spec: StoredSpec) -> int:
    """Count the trial processes a study holds at once, each with its ``resources``.

    Args:
        spec: The typed parts of the study's stored spec (``Study.sections``).

    Returns:
        ``reserved_processes(resources.pack, budget.max_concurrent)``.
    """
    return reserved_processes(spec.resources.pack, spec.budget.max_concurrent)


def reservation(spec: StoredSpec) -> tuple[float, int]:
    """Say what a study reserves while it runs (see the module docstring).

    Args:
        spec: The typed parts of the study's stored spec.

    Returns:
        ``(GPUs, trials)``: ``trial_processes × resources.gpu`` and ``budget.max_concurrent``.
    """
    return trial_processes(spec) * spec.resources.gpu, spec.budget.max_concurrent


def time_limit_s(spec: StoredSpec, settings: Settings) -> float:
    """Say how long a study may hold what it reserves, as its GPU-hour quota charges it.

    Args:
        spec: The typed parts of the study's stored spec.
        settings: The service's settings (``study_deadline_s``).

    Returns:
        Its ``budget.time`` in seconds, else ``FEDTUNE_STUDY_DEADLINE_S``; ``inf`` when
        neither bounds it.
    """
    budget_time = spec.budget.time
    if budget_time is not None:
        return float(budget_time)
    return float(settings.study_deadline_s) if settings.study_deadline_s else math.inf


def gpu_hour_charge(
    spec: StoredSpec,
    began: dt.datetime | None,
    ended: dt.datetime | None,
    *,
    running: bool,
    now: dt.datetime,
    settings: Settings,
) -> float:
    """Count what a study charges its project's GPU-hour quota now (see the module docstring).

    Args:
        spec: The typed parts of the study's stored spec.
        began: When it was dispatched (None: never).
        ended: When it ended (None: it has not).
        running: Whether it runs now (it may then still use the rest of its time limit).
        now: The time of the count (aware).
        settings: The service's settings (the window, the deadline).

    Returns:
        GPU-seconds: used within ``[now - window, now]``, plus for a running study
        ``GPUs × max(0, time limit - time run)``; ``inf`` for a running study with GPUs and
        no time limit.
    """
    gpus, _ = reservation(spec)
    if began is None or gpus <= 0 or (not running and ended is None):
        return 0.0  # never dispatched, no GPUs, or re-queued (it holds nothing while it waits)
    start = now - dt.timedelta(seconds=float(settings.fair_share_window_s))
    stop = now if running or ended is None else min(ended, now)
    used = max(0.0, (stop - max(began, start)).total_seconds())
    if not running:
        return gpus * used
    left = time_limit_s(spec, settings) - (now - began).total_seconds()
    return gpus * (used + max(left, 0.0))


def project_usage(session: Session, project: str, settings: Settings) -> dict[str, Any]:
    """What a project's studies reserve now and the GPU-hours they count in the window.

    Args:
        session: A database session.
        project: The project's name.
        settings: The service's settings (the fair-share window, the deadline).

    Returns:
        ``{"studies": {"queued", "running"}, "gpus": reserved, "trials": reserved,
        "gpu_hours": counted}`` (``gpu_hours`` None: a running study has no time limit).
    """
    # only the project's live studies (index ranges of (project, state, ...)), never its history;
    # revision 0005 filled in every NULL project, so no coalesce() hides the index
    live = [StudyState.QUEUED, StudyState.RUNNING]
    counts = dict(
        session.execute(
            select(Study.state, func.count())
            .where(Study.project == project, Study.state.in_(live))
            .group_by(Study.state)
        ).all()
    )
    now = dt.datetime.now(dt.UTC)
    gpus, trials, gpu_seconds = 0.0, 0, 0.0
    for _, state, spec, began, ended in recent_studies(session, now, settings, project):
        running = state == StudyState.RUNNING
        if running:
            g, t = reservation(spec)
            gpus, trials = gpus + g, trials + t
        gpu_seconds += gpu_hour_charge(
            spec, began, ended, running=running, now=now, settings=settings
        )
    studies = {
        "queued": int(counts.get(StudyState.QUEUED, 0)),
        "running": int(counts.get(StudyState.RUNNING, 0)),
    }
    return {
        "studies": studies,
        "gpus": gpus,
        "trials": trials,
        "gpu_hours": gpu_seconds / 3600.0 if math.isfinite(gpu_seconds) else None,
    }


def recent_studies(
    session: Session, now: dt.datetime, settings: Settings, project: str | None = None
) -> list[Any]:
    """Studies that count towards usage now: running, or finished within the window.

    Args:
        session: A database session.
        now: The time of the count (aware).
        settings: The service's settings (the fair-share window).
        project: Only this project's studies (None: every project's).

    Returns:
        Rows ``(project, state, spec, started_at, finished_at)``, ``spec`` the typed parts
        of the stored spec (parsed once per study): two index ranges of
        ``(state, finished_at)``, whatever the number of older finished studies. A re-queued
        study (started, not finished) is among them; it reserves nothing while it waits.
    """
    since = now - dt.timedelta(seconds=float(settings.fair_share_window_s))
    query = (
        select(
            Study.id,
            Study.created_at,
            Study.project,
            Study.state,
            Study.spec,
            Study.started_at,
            Study.finished_at,
        )
        .where(Study.started_at.is_not(None))
        .where(or_(Study.state == StudyState.RUNNING, Study.finished_at >= since))
    )
    if project is not None:
        query = query.where(Study.project == project)
    return [
        (project, state, stored_spec_of((key, created), spec), began, ended)
        for key, created, project, state, spec, began, ended in session.execute(query).all()
    ]
