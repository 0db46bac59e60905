"""Lifecycle states of studies and trials, and the legal study transitions.

    queued ──► running ──► succeeded
      │           │  └───► failed
      │           └──────► cancelled
      ├──────────────────► cancelled
      └◄── running (re-dispatch: the driver is gone, the study resumes)

Pure Python, shared by the service and the SDK (which imports no server module).
"""

from __future__ import annotations

import enum

__all__ = ["TERMINAL", "TRANSITIONS", "StudyState", "TrialState", "can_transition"]


class StudyState(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


class TrialState(enum.StrEnum):
    RUNNING = "running"
    COMPLETED = "completed"
    PRUNED = "pruned"  # stopped early by the scheduler (ASHA/median)
    FAILED = "failed"
    KILLED = "killed"  # cancelled with its study, or abandoned by a driver that died


TERMINAL = frozenset({StudyState.SUCCEEDED, StudyState.FAILED, StudyState.CANCELLED})

TRANSITIONS: dict[StudyState, frozenset[StudyState]] = {
    StudyState.QUEUED: frozenset({StudyState.RUNNING, StudyState.CANCELLED}),
    StudyState.RUNNING: frozenset(
        {StudyState.QUEUED, StudyState.SUCCEEDED, StudyState.FAILED, StudyState.CANCELLED}
    ),
    StudyState.SUCCEEDED: frozenset(),
    StudyState.FAILED: frozenset(),
    StudyState.CANCELLED: frozenset(),
}


def can_transition(old: StudyState, new: StudyState) -> bool:
    return new in TRANSITIONS[StudyState(old)]
