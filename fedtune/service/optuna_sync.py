"""The driver's read-only view of a study's Optuna storage (the tuning source of truth).

``run_study`` keeps every trial in ``<workdir>/optuna.db``; this view reads it only through
``fedtune.tuning.optuna.store.StudyStore`` (outcome, MLflow run ids, the ℓ_t curve — the attribute
names live there, not here). The driver reads it to learn MLflow
run ids while trials run, and after ``run_study`` returns hands :meth:`OptunaView.finished` to
the service (through its link, ``driver_link``): a trial whose final event never reached the database (the driver was killed
between Optuna's ``tell`` and the sink's write) gets its final state from Optuna, so the service
never shows fewer finished trials than were run.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from fedtune.outcomes import TrialOutcome, from_optuna_state, service_state

from .states import TrialState

__all__ = ["OptunaView"]

log = logging.getLogger(__name__)


class OptunaView:
    """The service's side of ``fedtune.tuning.optuna.store.StudyStore`` (the study's one record)."""

    def __init__(self, workdir: Path, study_name: str) -> None:
        self.workdir = Path(workdir)
        self.path = self.workdir / "optuna.db"
        self.study_name = study_name
        self._store: Any = None

    def exists(self) -> bool:
        return self.path.is_file()

    def _open(self) -> Any:
        if self._store is None:
            from fedtune.tuning.optuna.store import StudyStore

            self._store = StudyStore.existing(self.workdir, self.study_name)
        return self._store

    def parent_run(self) -> tuple[str | None, str | None]:
        """The MLflow parent run's id and its experiment's id, when recorded with it."""
        store = self._open()
        return (None, None) if store is None else store.parent_run()

    def run_id_of(self, number: int) -> str | None:
        store = self._open()
        return None if store is None else store.run_id_of(number)

    def finished(self) -> list[dict[str, Any]]:
        """Every finished trial of the Optuna storage, as the service records it.

        Returns:
            ``{number, params, run_id, state, value, outcome, curve: {rounds, loss}}`` each
            (``driver_ops.apply_finished_trials`` writes them); unfinished trials and queued
            ones a cancel dropped are left out.
        """
        store = self._open()
        if store is None:
            return []
        records = []
        for t in store.records():
            state = _state(t)
            if state is None:
                continue
            curve = t.curve or {}
            records.append(
                {
                    "number": int(t.number),
                    "params": dict(t.params or {}),
                    "run_id": t.run_id,
                    "state": str(state),
                    "value": _finite(t.value),
                    "outcome": t.outcome,
                    "curve": {
                        "rounds": [int(r) for r in curve.get("rounds", ())],
                        "loss": [_finite(x) for x in curve.get("loss", ())],
                    },
                }
            )
        return records

    def discard_waiting(self, *, orphans: bool = False) -> int:
        """Drop the study's queued (``WAITING``) trials: a cancelled study leaves none behind
        (``fedtune.tuning.driver.failures.discard_waiting``); with ``orphans`` (its driver is gone) the
        trials it left ``RUNNING`` end interrupted; returns how many."""
        store = self._open()
        if store is None:
            return 0
        from fedtune.tuning.driver.failures import discard_waiting

        return discard_waiting(store, orphans=orphans)


def _state(t: Any) -> TrialState | None:
    if t.state not in ("COMPLETE", "PRUNED", "FAIL"):
        return None  # RUNNING / WAITING: not finished
    outcome = t.outcome or from_optuna_state(t.state)
    if outcome == TrialOutcome.CANCELLED:  # queued, dropped by a cancel: never ran
        return None
    return service_state(outcome)


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
