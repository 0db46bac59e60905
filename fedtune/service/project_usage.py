"""What a project uses now, against its quota (``GET /v1/projects/{p}``, ``/metrics``).

A study *reserves* what it may use at once: ``budget.max_concurrent × resources.gpu`` GPUs and
``budget.max_concurrent`` trials, from its dispatch until it ends; a queued or running study is
*active*. Read from the studies table (its spec), so every replica answers the same.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .models import Study
from .states import StudyState

__all__ = ["project_usage", "reservation"]


def reservation(spec: dict[str, Any]) -> tuple[float, int]:
    """``(GPUs, trials)`` a study with ``spec`` reserves while it runs."""
    budget = spec.get("budget") or {}
    resources = spec.get("resources") or {}
    concurrent = int(budget.get("max_concurrent") or 1)
    return concurrent * float(resources.get("gpu") or 0.0), concurrent


def project_usage(session: Session, project: str) -> dict[str, Any]:
    """``{"studies": {"queued", "running"}, "gpus": reserved, "trials": reserved}`` now."""
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
    running = session.scalars(
        select(Study.spec).where(Study.project == project, Study.state == StudyState.RUNNING)
    )
    gpus, trials = 0.0, 0
    for spec in running:
        g, t = reservation(spec or {})
        gpus, trials = gpus + g, trials + t
    studies = {
        "queued": int(counts.get(StudyState.QUEUED, 0)),
        "running": int(counts.get(StudyState.RUNNING, 0)),
    }
    return {
        "studies": studies,
        "gpus": gpus,
        "trials": trials,
    }
