"""What a project uses now, against its quota (``GET /v1/projects/{p}``, ``/metrics``).

A study *reserves* what it may use at once, from its dispatch until it ends:
``processes × resources.gpu`` GPUs, where ``processes`` is the trial processes it holds at once
(:func:`~fedtune.tuning.packing.reserved_processes`: ``budget.max_concurrent``, or
``ceil(max_concurrent / P)`` for a study packing an integer ``resources.pack`` = P
configurations per process), and ``budget.max_concurrent`` trials (configurations, packed or
not). A queued or running study is *active*. Read from the studies table (its spec), so every
replica answers the same; :func:`reservation` is the one place that computes a reservation
(admission, the scheduler's claim and the usage shown here all call it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from fedtune.tuning.packing import reserved_processes

from .models import Study
from .states import StudyState

__all__ = ["project_usage", "reservation", "trial_processes"]


def _concurrent(spec: Mapping[str, Any]) -> int:
    """``budget.max_concurrent`` of a stored spec: configurations trained at once."""
    return int((spec.get("budget") or {}).get("max_concurrent") or 1)


def trial_processes(spec: Mapping[str, Any]) -> int:
    """Count the trial processes a study holds at once, each with its ``resources``.

    Args:
        spec: The study's stored spec (its ``to_dict()``).

    Returns:
        ``reserved_processes(resources.pack, budget.max_concurrent)``.
    """
    pack = (spec.get("resources") or {}).get("pack") or 1
    return reserved_processes(pack, _concurrent(spec))


def reservation(spec: Mapping[str, Any]) -> tuple[float, int]:
    """Say what a study reserves while it runs (see the module docstring).

    Args:
        spec: The study's stored spec.

    Returns:
        ``(GPUs, trials)``: ``trial_processes × resources.gpu`` and ``budget.max_concurrent``.
    """
    gpu = float((spec.get("resources") or {}).get("gpu") or 0.0)
    return trial_processes(spec) * gpu, _concurrent(spec)


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
