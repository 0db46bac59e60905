"""What a study driver may read and write of its own study, against the service database.

One owner of every write a driver makes: the service's ``/v1/driver`` routes
(:mod:`.api.routes_driver`, a driver holding a per-study credential) and a driver that holds the
database URL itself (:class:`.driver_link.DbLink`) call the same functions. Each takes the
study's id and touches that study's rows only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from .db import Database
from .driver_claim import Claim
from .reconcile import recover_study
from .repository import Repository
from .states import StudyState, TrialState
from .tickets import DriverAccess, verify

__all__ = [
    "Claim",
    "access",
    "apply_finished_trials",
    "claim",
    "finish",
    "heartbeat",
    "is_cancelled",
    "record_rounds",
    "recover",
    "reset_trials",
    "set_mlflow_ids",
    "study_package",
    "trial_ended",
    "trial_started",
]

#: the study fields a driver's final write may set
FINAL_FIELDS = frozenset(
    {"error", "best_trial", "best_value", "mlflow_experiment_id", "mlflow_run_id"}
)


def claim(db: Database, study_id: str) -> Claim:
    """The study as its driver starts it (``ConfigError``-free: a missing study raises).

    Args:
        db: the service database.
        study_id: the study.

    Returns:
        Its state, attempt, document, code digest and owner.
    """
    with db.session(readonly=True) as session:
        study = Repository(session).require_study(study_id)
        return Claim(
            str(study.state), study.attempts, dict(study.spec), study.code_sha256, study.owner
        )


def access(db: Database, study_id: str, token: str) -> DriverAccess | None:
    """What a driver credential opens (:func:`.tickets.verify`: ``InvalidTokenError`` for a
    revoked one).

    Args:
        db: the service database.
        study_id: the study the caller names.
        token: the credential.

    Returns:
        The attempt it is valid for and the study's current one; None: no credential of it.
    """
    with db.session(readonly=True) as session:
        return verify(session, study_id, token)


def finish(db: Database, study_id: str, state: StudyState, values: Mapping[str, Any]) -> bool:
    """The final state, written only while the study is still ``running``.

    Args:
        db: the service database.
        study_id: the study.
        state: ``succeeded`` or ``failed``.
        values: of :data:`FINAL_FIELDS` only.

    Returns:
        False when the study changed state meanwhile (nothing written).
    """
    if state not in (StudyState.SUCCEEDED, StudyState.FAILED):
        raise ValueError(f"a driver ends a study succeeded or failed, not {state}")
    unknown = set(values) - FINAL_FIELDS
    if unknown:
        raise ValueError(f"a driver does not set {sorted(unknown)}")
    with db.session() as session:
        return Repository(session).transition(
            study_id, state, expected=[StudyState.RUNNING], **dict(values)
        )


def heartbeat(db: Database, study_id: str, attempt: int) -> bool:
    """Stamp ``heartbeat_at``; False once the study is no longer this attempt's to run."""
    from .models import utcnow

    with db.session() as session:
        repo = Repository(session)
        study = repo.require_study(study_id)
        if study.state != StudyState.RUNNING or study.attempts != attempt:
            return False
        repo.update_study(study_id, heartbeat_at=utcnow())
    return True


def is_cancelled(db: Database, study_id: str) -> bool:
    """Whether the study was cancelled."""
    with db.session(readonly=True) as session:
        return Repository(session).require_study(study_id).state == StudyState.CANCELLED


def reset_trials(db: Database, study_id: str) -> int:
    """Drop the study's recorded trials (its Optuna storage was lost); how many."""
    with db.session() as session:
        return Repository(session).delete_trials(study_id)


def set_mlflow_ids(db: Database, study_id: str, run_id: str, experiment_id: str | None) -> None:
    """The study's MLflow parent run and experiment, for links."""
    with db.session() as session:
        Repository(session).update_study(
            study_id, mlflow_run_id=run_id, mlflow_experiment_id=experiment_id
        )


def trial_started(
    db: Database, study_id: str, number: int, params: Mapping[str, Any], run_id: str | None
) -> None:
    """A trial began (idempotent: a resumed driver may report it again)."""
    with db.session() as session:
        Repository(session).start_trial(study_id, number, params, run_id)


def record_rounds(
    db: Database, study_id: str, number: int, rows: Iterable[Mapping[str, Any]]
) -> None:
    """Rounds of a trial: ``[{"round": r, metric: value, …}, …]`` in one transaction."""
    rows = list(rows)
    if not rows:
        return
    with db.session() as session:
        repo = Repository(session)
        for row in rows:
            metrics = {k: v for k, v in row.items() if k != "round"}
            repo.record_round(study_id, number, int(row["round"]), metrics)


def trial_ended(
    db: Database,
    study_id: str,
    number: int,
    state: TrialState,
    value: float | None,
    outcome: str | None,
) -> None:
    """A trial's end."""
    with db.session() as session:
        Repository(session).finish_trial(study_id, number, state, value, outcome)


def apply_finished_trials(db: Database, study_id: str, records: Iterable[Mapping[str, Any]]) -> int:
    """Give each finished trial of the Optuna storage its final state in the database.

    Args:
        db: the service database.
        study_id: the study.
        records: ``{number, params, run_id, state, value, outcome, curve: {rounds, loss}}`` each
            (``fedtune.service.optuna_sync.OptunaView.finished``).

    Returns:
        How many trials changed.
    """
    fixed = 0
    with db.session() as session:
        repo = Repository(session)
        for record in records:
            state, number = TrialState(record["state"]), int(record["number"])
            row = repo.get_trial(study_id, number, lock=True)
            if row is not None and row.state == state:
                continue
            if row is None:
                repo.start_trial(study_id, number, record.get("params") or {}, record.get("run_id"))
                curve = record.get("curve") or {}
                for r, loss in zip(curve.get("rounds", ()), curve.get("loss", ()), strict=False):
                    finite = loss is not None and math.isfinite(loss)
                    metrics = {"client_loss": float(loss) if finite else None}
                    repo.record_round(study_id, number, int(r), metrics)
            repo.finish_trial(study_id, number, state, record.get("value"), record.get("outcome"))
            fixed += 1
    return fixed


def recover(
    db: Database, study_id: str, attempt: int, reason: str, max_attempts: int, *, counts: bool
) -> str:
    """A driver that hit a transient error hands its study back: re-queued or failed.

    Returns:
        The action taken: ``requeued``, ``failed`` or ``skipped``.
    """
    return recover_study(db, study_id, attempt, reason, max_attempts, counts=counts).action


def study_package(db: Database, study_id: str) -> bytes | None:
    """The study's uploaded code package, if it has one."""
    with db.session(readonly=True) as session:
        repo = Repository(session)
        study = repo.require_study(study_id)
        return repo.get_code_package(study.code_sha256) if study.code_sha256 else None
