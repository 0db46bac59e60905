"""Which queued studies start now: project quotas, weighted fair share, priorities (the
``local`` and ``ray`` backends; on ``kubernetes`` Kueue would decide).

A study *reserves*, from its dispatch until it ends, ``resources.gpu`` GPUs per trial process it
holds at once (``max_concurrent`` of them, or ``ceil(max_concurrent / P)`` when it packs
``resources.pack`` = P configurations per process) and ``max_concurrent`` concurrent trials
(configurations, packed or not): :func:`.project_usage.reservation`; it counts as one active
study. :func:`plan` admits queued studies one at a time while there are free study
slots (``FEDTUNE_MAX_CONCURRENT_STUDIES``):

1. a study whose project's reservations would then exceed one of its quotas (GPUs, trials,
   active studies, GPU-hours), or the cluster's GPUs (``FEDTUNE_CLUSTER_GPUS``), is not
   admitted: it stays ``queued`` with the reason (``waiting for project quota: 8/8 GPUs``) and
   never fails for it. The GPU-hour quota is a budget in compute over the fair-share window:
   a study is admitted when the window's GPU-hours (:func:`.project_usage.gpu_hour_charge`:
   used, plus what running studies may still use) plus its own GPUs × ``budget.time`` (else
   ``FEDTUNE_STUDY_DEADLINE_S``) fit ``quota_gpu_hours``, so a study that declares a short
   ``budget.time`` fits where an open-ended one waits;
2. among projects with an admissible study, the next admission goes to the one furthest below
   its weighted fair share: the lowest ``(GPU-seconds used in the sliding window
   FEDTUNE_FAIR_SHARE_WINDOW_S + GPUs reserved now × 1 s) / weight`` — Slurm's fair-share in
   small (a study that reserves no GPU counts one GPU-second per second, so CPU-only work is
   shared too);
3. within a project, by ``priority`` (higher first), then submission time.

Pure planning over plain values: the scheduler reads the state, calls :func:`plan` and claims
what it admits (tests drive it directly).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["Candidate", "Decision", "ProjectLoad", "gpu_seconds", "plan", "plan_dispatch"]


@dataclass(frozen=True)
class Candidate:
    """A queued study: what it would reserve."""

    id: str
    project: str
    priority: int
    created_at: dt.datetime
    gpus: float
    trials: int
    gpu_seconds: float = 0.0  # what it may use: GPUs × its time limit (inf: no limit)


@dataclass
class ProjectLoad:
    """A project's quotas (None: unlimited), weight, reservations now and recent usage."""

    name: str
    quota_gpus: float | None = None
    quota_trials: int | None = None
    quota_studies: int | None = None
    weight: float = 1.0
    gpus: float = 0.0
    trials: int = 0
    studies: int = 0
    gpu_seconds: float = 0.0
    quota_gpu_hours: float | None = None
    gpu_hour_seconds: float = 0.0  # counted against quota_gpu_hours: used + still held

    def refusal(self, c: Candidate) -> str | None:
        """Why ``c`` does not fit this project's quota now, or None."""
        if self.quota_gpus is not None and self.gpus + c.gpus > self.quota_gpus + 1e-9:
            return f"waiting for project quota: {self.gpus:g}/{self.quota_gpus:g} GPUs"
        if self.quota_trials is not None and self.trials + c.trials > self.quota_trials:
            return f"waiting for project quota: {self.trials}/{self.quota_trials} trials"
        if self.quota_studies is not None and self.studies + 1 > self.quota_studies:
            return f"waiting for project quota: {self.studies}/{self.quota_studies} active studies"
        return self._gpu_hour_refusal(c)

    def _gpu_hour_refusal(self, c: Candidate) -> str | None:
        if self.quota_gpu_hours is None or c.gpu_seconds <= 0:
            return None
        quota = self.quota_gpu_hours * 3600.0
        if self.gpu_hour_seconds + c.gpu_seconds <= quota + 1e-6:
            return None
        if math.isinf(c.gpu_seconds):
            return (
                "waiting for project quota: a study with GPUs and no budget.time has no time"
                " limit (FEDTUNE_STUDY_DEADLINE_S is 0), so it never fits a GPU-hour quota"
            )
        ask = c.gpu_seconds / 3600.0
        if c.gpu_seconds > quota + 1e-6:
            return (
                f"waiting for project quota: it may use {ask:.2f} GPU-hours (GPUs × budget.time),"
                f" more than the project's {self.quota_gpu_hours:g} per window"
            )
        counted = self.gpu_hour_seconds / 3600.0
        return (
            f"waiting for project quota: {counted:.2f}/{self.quota_gpu_hours:g} GPU-hours used"
            f" or held in the window, and it may use {ask:.2f}"
        )

    def share(self) -> float:
        """Usage per unit of weight (lower: further below its fair share)."""
        return (self.gpu_seconds + max(self.gpus, 0.0)) / max(self.weight, 1e-9)

    def take(self, c: Candidate) -> None:
        self.gpus += c.gpus
        self.trials += c.trials
        self.studies += 1
        self.gpu_hour_seconds += c.gpu_seconds


@dataclass
class Decision:
    """What :func:`plan` decided: studies to start (in order) and why the others wait."""

    admit: list[str] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)


def plan(
    candidates: Sequence[Candidate],
    loads: Iterable[ProjectLoad],
    slots: int,
    cluster_gpus: float | None = None,
    cluster_used: float = 0.0,
) -> Decision:
    """Admit up to ``slots`` of ``candidates`` (see the module docstring)."""
    by_project = {p.name: p for p in loads}
    queues: dict[str, list[Candidate]] = {}
    for c in sorted(candidates, key=lambda c: (-c.priority, c.created_at, c.id)):
        queues.setdefault(c.project, []).append(c)
        by_project.setdefault(c.project, ProjectLoad(c.project))
    decision, used = Decision(), cluster_used
    while slots > 0:
        ready: list[tuple[float, str, Candidate]] = []
        for name, queue in queues.items():
            if not queue:
                continue
            load, head = by_project[name], queue[0]
            reason = load.refusal(head)
            if (
                reason is None
                and cluster_gpus is not None
                and used + head.gpus > cluster_gpus + 1e-9
            ):
                reason = f"waiting for cluster capacity: {used:g}/{cluster_gpus:g} GPUs"
            if reason is None:
                ready.append((load.share(), name, head))
            else:
                decision.waiting.setdefault(head.id, reason)
        if not ready:
            break
        _, name, chosen = min(ready, key=lambda r: (r[0], r[2].created_at, r[1]))
        queues[name].pop(0)
        by_project[name].take(chosen)
        used += chosen.gpus
        decision.admit.append(chosen.id)
        decision.waiting.pop(chosen.id, None)
        slots -= 1
    for queue in queues.values():  # behind their project's head: waiting for the same reason
        for c in queue:
            if c.id not in decision.admit:
                decision.waiting.setdefault(c.id, _behind(queue, c, decision))
    return decision


def _behind(queue: list[Candidate], c: Candidate, decision: Decision) -> str:
    head = queue[0] if queue else None
    if head is not None and head.id != c.id and head.id in decision.waiting:
        return decision.waiting[head.id]
    return "waiting for a free study slot (FEDTUNE_MAX_CONCURRENT_STUDIES)"


def gpu_seconds(
    spans: Iterable[tuple[float, dt.datetime | None, dt.datetime | None]],
    now: dt.datetime,
    window_s: float,
) -> float:
    """GPU-seconds of ``(gpus, started_at, finished_at)`` spans within ``[now - window, now]``
    (a study reserving no GPU counts as one, see the module docstring). The times are aware,
    as the database's ``UTCDateTime`` columns hand them back."""
    start = now - dt.timedelta(seconds=window_s)
    total = 0.0
    for gpus, began, ended in spans:
        if began is None:
            continue
        lo, hi = max(began, start), min(ended or now, now)
        if hi > lo:
            total += max(gpus, 1.0) * (hi - lo).total_seconds()
    return total


def plan_dispatch(
    session: Any,
    queued: Sequence[Any],
    slots: int,
    settings: Settings,
    cluster_gpus: float | None = None,
) -> Decision:
    """:func:`plan` over the database's state: ``queued`` study rows, every project's quotas,
    the running studies' reservations and the window's GPU-seconds. The cluster's GPUs are
    ``settings.cluster_gpus`` when set, else ``cluster_gpus`` (what the backend reports)."""
    from sqlalchemy import select

    from .models import DEFAULT_PROJECT, Project
    from .project_usage import gpu_hour_charge, recent_studies, reservation, time_limit_s
    from .states import StudyState

    now = dt.datetime.now(dt.UTC)
    window = float(settings.fair_share_window_s)
    # with Kueue the cluster's queues decide quotas (ClusterQueue); fedtune only shares fairly
    kueue = bool(settings.k8s_kueue) and str(settings.backend) == "kubernetes"
    loads = {
        p.name: ProjectLoad(
            p.name,
            None if kueue else p.quota_gpus,
            None if kueue else p.quota_trials,
            None if kueue else p.quota_studies,
            p.weight or 1.0,
            quota_gpu_hours=None if kueue else p.quota_gpu_hours,
        )
        for p in session.scalars(select(Project))
    }
    used = 0.0
    for project, state, spec, began, ended in recent_studies(session, now, settings):
        load = loads.setdefault(project or DEFAULT_PROJECT, ProjectLoad(project or DEFAULT_PROJECT))
        gpus, trials = reservation(spec)
        if state == StudyState.QUEUED:
            continue  # re-queued: it reserves nothing while it waits
        running = state == StudyState.RUNNING
        if running:
            load.gpus += gpus
            load.trials += trials
            load.studies += 1
            used += gpus
            ended = None
        load.gpu_seconds += gpu_seconds([(gpus, began, ended)], now, window)
        load.gpu_hour_seconds += gpu_hour_charge(
            spec, began, ended, running=running, now=now, settings=settings
        )
    candidates = []
    for row in queued:
        gpus, trials = reservation(row.sections)
        limit = time_limit_s(row.sections, settings) if gpus > 0 else 0.0
        candidates.append(
            Candidate(
                row.id,
                row.project or DEFAULT_PROJECT,
                int(row.priority or 0),
                row.created_at,
                gpus,
                trials,
                gpu_seconds=gpus * limit,
            )
        )
    capacity = settings.cluster_gpus if settings.cluster_gpus is not None else cluster_gpus
    return plan(candidates, loads.values(), slots, capacity, used)
