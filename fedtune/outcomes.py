"""How a trial ended: one vocabulary for the driver, the MLflow runs, Optuna and the service.

A trial's function reports ``outcome`` = :data:`RUNNING` with every result but its last, and
``completed`` or ``diverged`` with its last. What the driver has when the trial is over decides
its :class:`TrialOutcome` (:func:`final_outcome`):

    last reported outcome       →  outcome
    ``running``                 →  stopped    (stopped early: a scheduler or the stop rule)
    ``completed``               →  completed
    ``diverged``                →  diverged
    ``stopped``                 →  stopped
    nothing, or the trial raised →  failed

Two more are never reported by a trial: ``interrupted`` (left running by a driver that died;
re-run on resume) and ``cancelled`` (queued, dropped when its study was cancelled; never ran).

Each outcome has one Optuna trial state (:func:`optuna_state`, by name), one MLflow run status
(:func:`mlflow_status`) and one service trial state (:func:`service_state`). The values are the
strings stored in the Optuna user attribute ``outcome``, the MLflow tag ``outcome``, the
service's database and its API. Pure Python: the light install (SDK and client CLI) imports it.
"""

from __future__ import annotations

import enum

from fedtune.states import TrialState

__all__ = [
    "RAN",
    "RUNNING",
    "TrialOutcome",
    "final_outcome",
    "from_optuna_state",
    "mlflow_status",
    "optuna_state",
    "service_state",
]

RUNNING = "running"  # the outcome a trial reports with every result but its last


class TrialOutcome(enum.StrEnum):
    COMPLETED = "completed"  # trained every round
    DIVERGED = "diverged"  # loss became non-finite or exceeded the divergence bound
    STOPPED = "stopped"  # stopped early by a scheduler (ASHA, median) or the stop rule
    FAILED = "failed"  # raised, or ended without reporting an outcome
    INTERRUPTED = "interrupted"  # left running by a driver that died (re-run on resume)
    CANCELLED = "cancelled"  # queued, dropped when its study was cancelled (never ran)


#: Outcomes of a trial that trained and has a loss curve (the trade-off uses these).
RAN = frozenset({TrialOutcome.COMPLETED, TrialOutcome.DIVERGED, TrialOutcome.STOPPED})

_REPORTED = {
    RUNNING: TrialOutcome.STOPPED,
    TrialOutcome.COMPLETED: TrialOutcome.COMPLETED,
    TrialOutcome.DIVERGED: TrialOutcome.DIVERGED,
    TrialOutcome.STOPPED: TrialOutcome.STOPPED,
}

_OPTUNA = {
    TrialOutcome.COMPLETED: "COMPLETE",
    TrialOutcome.DIVERGED: "COMPLETE",  # with the worst possible objective values
    TrialOutcome.STOPPED: "PRUNED",
    TrialOutcome.FAILED: "FAIL",
    TrialOutcome.INTERRUPTED: "FAIL",
    TrialOutcome.CANCELLED: "FAIL",
}

_OF_OPTUNA = {"COMPLETE": TrialOutcome.COMPLETED, "PRUNED": TrialOutcome.STOPPED}

_MLFLOW = {
    TrialOutcome.COMPLETED: "FINISHED",
    TrialOutcome.DIVERGED: "FINISHED",
    TrialOutcome.STOPPED: "FINISHED",
    TrialOutcome.FAILED: "FAILED",
    TrialOutcome.INTERRUPTED: "KILLED",
    TrialOutcome.CANCELLED: "KILLED",
}

_SERVICE = {
    TrialOutcome.COMPLETED: TrialState.COMPLETED,
    TrialOutcome.DIVERGED: TrialState.COMPLETED,
    TrialOutcome.STOPPED: TrialState.PRUNED,
    TrialOutcome.FAILED: TrialState.FAILED,
    TrialOutcome.INTERRUPTED: TrialState.KILLED,
    TrialOutcome.CANCELLED: TrialState.KILLED,
}


def final_outcome(last_reported: str | None, *, error: bool = False) -> TrialOutcome:
    """Decide how a trial ended from the last outcome it reported (the table above).

    Args:
        last_reported: the ``outcome`` of the trial's last result; ``None`` when it reported
            none (or no result at all).
        error: the trial raised (its last report, if any, does not count).

    Returns:
        The trial's outcome: ``failed`` after an error, no report or an unknown report.
    """
    if error or last_reported is None:
        return TrialOutcome.FAILED
    return _REPORTED.get(str(last_reported), TrialOutcome.FAILED)


def optuna_state(outcome: str) -> str:
    """Name the Optuna trial state of a trial with this outcome.

    Args:
        outcome: a :class:`TrialOutcome` value.

    Returns:
        The name of an ``optuna.trial.TrialState`` member: ``COMPLETE``, ``PRUNED`` or ``FAIL``
        (``TrialState[name]`` is the state; this module does not import Optuna).
    """
    return _OPTUNA[TrialOutcome(outcome)]


def from_optuna_state(name: str) -> TrialOutcome:
    """Give the outcome of a finished Optuna trial that has no recorded ``outcome``.

    Args:
        name: the name of its ``optuna.trial.TrialState``.

    Returns:
        ``completed`` for ``COMPLETE``, ``stopped`` for ``PRUNED``, otherwise ``failed``.
    """
    return _OF_OPTUNA.get(name, TrialOutcome.FAILED)


def mlflow_status(outcome: str) -> str:
    """Give the MLflow run status of a trial with this outcome.

    Args:
        outcome: a :class:`TrialOutcome` value.

    Returns:
        ``FINISHED`` (completed, diverged, stopped), ``FAILED`` or ``KILLED`` (interrupted,
        cancelled).
    """
    return _MLFLOW[TrialOutcome(outcome)]


def service_state(outcome: str) -> TrialState:
    """Give the service's trial state of a trial with this outcome.

    Args:
        outcome: a :class:`TrialOutcome` value.

    Returns:
        ``completed`` (completed, diverged), ``pruned`` (stopped), ``failed`` or ``killed``
        (interrupted, cancelled).
    """
    return _SERVICE[TrialOutcome(outcome)]
