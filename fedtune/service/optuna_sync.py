"""The driver's read-only view of a study's Optuna storage (the tuning source of truth).

``run_study`` keeps every trial in ``<workdir>/optuna.db`` (``fedtune/tuning/optuna_glue.py``):
user attributes ``outcome`` and ``mlflow_run_id`` per trial, ``mlflow_parent_run_id`` on the
study, the ℓ_t curve in the system attribute ``fedtune:curve``. The driver reads it to learn MLflow
run ids while trials run, and after ``run_study`` returns to :meth:`OptunaView.sync_into` the
service database: a trial whose final event never reached the database (the driver was killed
between Optuna's ``tell`` and the sink's write) gets its final state from Optuna, so the service
never shows fewer finished trials than were run.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from .db import Database
from .repository import Repository
from .states import TrialState

__all__ = ["OptunaView"]

log = logging.getLogger(__name__)
CURVE_ATTR = "fedtune:curve"


class OptunaView:
    def __init__(self, workdir: Path, study_name: str) -> None:
        self.path = Path(workdir) / "optuna.db"
        self.study_name = study_name
        self._storage: Any = None
        self._study_id: int | None = None

    def exists(self) -> bool:
        return self.path.is_file()

    def _open(self) -> tuple[Any, int] | None:
        if self._storage is None:
            if not self.exists():
                return None
            from optuna.storages import RDBStorage

            url = f"sqlite:///{self.path.resolve()}"
            self._storage = RDBStorage(url, engine_kwargs={"connect_args": {"timeout": 30}})
        if self._study_id is None:
            try:
                self._study_id = self._storage.get_study_id_from_name(self.study_name)
            except KeyError:
                return None
        return self._storage, self._study_id

    def parent_run_id(self) -> str | None:
        opened = self._open()
        if opened is None:
            return None
        storage, study_id = opened
        return storage.get_study_user_attrs(study_id).get("mlflow_parent_run_id")

    def run_id_of(self, number: int) -> str | None:
        opened = self._open()
        if opened is None:
            return None
        storage, study_id = opened
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
        return storage.get_trial_user_attrs(trial_id).get("mlflow_run_id")

    def sync_into(self, db: Database, study_id: str) -> int:
        """Give every finished Optuna trial its final state in the database; returns #fixed."""
        opened = self._open()
        if opened is None:
            return 0
        storage, optuna_study = opened
        fixed = 0
        with db.session() as session:
            repo = Repository(session)
            for t in storage.get_all_trials(optuna_study, deepcopy=False):
                state = _state(t)
                row = repo.get_trial(study_id, t.number, lock=True)
                if state is None or (row is not None and row.state == state):
                    continue
                if row is None:
                    repo.start_trial(
                        study_id, t.number, t.params, t.user_attrs.get("mlflow_run_id")
                    )
                    _curve_into(repo, study_id, t)
                value = t.values[0] if t.values else None
                outcome = t.user_attrs.get("outcome")
                repo.finish_trial(study_id, t.number, state, value, outcome)
                fixed += 1
        if fixed:
            log.info("study %s: %d trial(s) synchronised from the Optuna storage", study_id, fixed)
        return fixed

    def discard_waiting(self) -> int:
        """Drop the study's queued (``WAITING``) trials: a cancelled study leaves none behind
        (``fedtune.tuning.failures.discard_waiting``); returns how many."""
        opened = self._open()
        if opened is None:
            return 0
        from fedtune.tuning.failures import discard_waiting
        from fedtune.tuning.store import StudyStore

        return discard_waiting(StudyStore(opened[0], self.study_name))


def _state(t: Any) -> TrialState | None:
    name = t.state.name
    if name == "COMPLETE":
        return TrialState.COMPLETED
    if name == "PRUNED":
        return TrialState.PRUNED
    if name == "FAIL":
        if t.user_attrs.get("outcome") == "cancelled":  # queued, dropped by a cancel: never ran
            return None
        return (
            TrialState.KILLED if t.user_attrs.get("outcome") == "interrupted" else TrialState.FAILED
        )
    return None  # RUNNING / WAITING: not finished


def _curve_into(repo: Repository, study_id: str, t: Any) -> None:
    curve = t.system_attrs.get(CURVE_ATTR) or {}
    for r, loss in zip(curve.get("rounds", ()), curve.get("loss", ()), strict=False):
        value = None if loss is None or not math.isfinite(loss) else float(loss)
        repo.record_round(study_id, t.number, int(r), {"client_loss": value})
