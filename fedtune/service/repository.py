"""The repository: every query of the service, the scheduler and the driver (none in handlers).

A :class:`Repository` wraps one session opened by ``Database.session()`` (the transaction
boundary); its methods never commit. State changes are compare-and-set updates
(``UPDATE … WHERE state IN (…)``) so the service, the scheduler and a driver racing on one study
cannot both win. Trial writes are keyed by (study, Optuna trial number) and rounds by
(trial, round): a driver that resumes and reports a trial again updates it, never duplicates it.
Non-finite floats are stored as NULL (JSON has no ∞/NaN; PostgreSQL rejects them in JSON).
A study's ``error`` is stored through :func:`fedtune.redact.scrub_text`: no URI's password.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import func, null, or_, select, tuple_, update
from sqlalchemy.orm import Session, defer

from fedtune.outcomes import TrialOutcome
from fedtune.redact import scrub_text

from .errors import IllegalStateChangeError, StudyNotFoundError, TrialNotFoundError
from .leader import fence_clause
from .models import (
    CodePackageOwner,
    CodePackageRow,
    IdempotencyKey,
    Study,
    Trial,
    TrialRound,
    utcnow,
)
from .states import TERMINAL, StudyState, TrialState, can_transition

__all__ = ["Repository", "json_safe"]

_TRIAL_DONE = frozenset(
    {TrialState.COMPLETED, TrialState.PRUNED, TrialState.FAILED, TrialState.KILLED}
)


def json_safe(value: Any) -> Any:
    """``value`` with non-finite floats replaced by ``None`` (recursively)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else float(value)


class Repository:
    def __init__(self, session: Session) -> None:
        self.session = session

    # ---------------------------------------------------------------- studies

    def add_study(self, study: Study) -> Study:
        self.session.add(study)
        self.session.flush()
        return study

    def get_study(self, study_id: str) -> Study | None:
        return self.session.get(Study, study_id)

    def require_study(self, study_id: str) -> Study:
        study = self.get_study(study_id)
        if study is None:
            raise StudyNotFoundError(f"no study {study_id!r}")
        return study

    def study_attempts(self, study_id: str) -> int:
        """A study's current dispatch attempt, without loading the study (its spec)."""
        attempts = self.session.scalar(select(Study.attempts).where(Study.id == study_id))
        if attempts is None:
            raise StudyNotFoundError(f"no study {study_id!r}")
        return attempts

    def page_studies(
        self,
        states: Sequence[StudyState] = (),
        projects: Sequence[str] | None = None,
        *,
        after: tuple[dt.datetime, str] | None = None,
        ascending: bool = False,
        limit: int = 50,
        offset: int = 0,
        summary: bool = False,
    ) -> list[Study]:
        """Studies in one of ``states`` (empty: any) of one of ``projects`` (None: any), ordered
        by ``(created_at, id)`` (newest first unless ``ascending``), strictly after the keyset
        ``after`` (``paging.Cursor``), skipping ``offset``. One index range read per filter
        combination (revision 0005). ``summary`` leaves ``spec`` and ``driver_ref`` unloaded."""
        if projects is not None and not projects:
            return []
        order = (Study.created_at, Study.id)
        query = self._filtered(select(Study), states, projects)
        if after is not None:
            key = tuple_(*order)
            query = query.where(key > tuple_(*after) if ascending else key < tuple_(*after))
        query = query.order_by(*(order if ascending else [c.desc() for c in order]))
        if summary:
            query = query.options(defer(Study.spec), defer(Study.driver_ref))
        return list(self.session.scalars(query.limit(limit).offset(offset or None)))

    def count_studies(
        self, states: Sequence[StudyState] = (), projects: Sequence[str] | None = None
    ) -> int:
        """How many studies :meth:`page_studies` would page through (an index-only count)."""
        if projects is not None and not projects:
            return 0
        count = self._filtered(select(func.count()).select_from(Study), states, projects)
        return int(self.session.scalar(count) or 0)

    @staticmethod
    def _filtered(query: Any, states: Sequence[StudyState], projects: Sequence[str] | None) -> Any:
        # equality for one value, IN for several: both match the (project, state, created_at,
        # id) indexes; revision 0005 filled in every NULL project, so no coalesce() is needed
        for column, values in ((Study.state, list(states)), (Study.project, projects)):
            if values:
                values = list(values)
                query = query.where(column == values[0] if len(values) == 1 else column.in_(values))
        return query

    def count_in(self, state: StudyState) -> int:
        """How many studies are in ``state`` (an index-only count of that state's range)."""
        query = select(func.count()).select_from(Study).where(Study.state == state)
        return int(self.session.scalar(query) or 0)

    def studies_in(self, state: StudyState, limit: int | None = None) -> list[Study]:
        """Studies in ``state``, oldest first (the scheduler's FIFO order)."""
        query = select(Study).where(Study.state == state)
        query = query.order_by(Study.created_at, Study.id).limit(limit)
        return list(self.session.scalars(query))

    def finished_with_driver(self, backend: str, limit: int) -> list[tuple[str, dict | None]]:
        """``(id, driver_ref)`` of final studies on ``backend`` that still hold a reference."""
        final = [s for s in StudyState if s.terminal]
        query = (
            select(Study.id, Study.driver_ref)
            .where(Study.state.in_(final), Study.backend == backend, Study.driver_ref.is_not(None))
            .order_by(Study.updated_at, Study.id)
            .limit(limit)
        )
        return [(sid, dict(ref) if ref else None) for sid, ref in self.session.execute(query)]

    def clear_driver_ref(self, study_id: str) -> None:
        """SQL NULL (not JSON ``null``), so :meth:`finished_with_driver` skips the study."""
        self.update_study(study_id, driver_ref=null())

    def count_by_state(self) -> dict[StudyState, int]:
        rows = self.session.execute(select(Study.state, func.count()).group_by(Study.state))
        counts = dict.fromkeys(StudyState, 0)
        counts.update({StudyState(state): int(n) for state, n in rows})
        return counts

    def transition(
        self,
        study_id: str,
        to: StudyState,
        *,
        expected: Iterable[StudyState] | None = None,
        fence: Any = None,
        **values: Any,
    ) -> bool:
        """Compare-and-set ``state`` to ``to`` from one of ``expected`` (default: every state
        that may legally move to ``to``); False when the study was not in one of them — or,
        with a scheduler's ``fence`` (``leader.Fence``), when that leader was deposed."""
        allowed = [s for s in (expected or StudyState) if can_transition(s, to)]
        if not allowed:
            raise IllegalStateChangeError(f"no state may move to {to}")
        values = _scrub_error(values)
        now = utcnow()
        stamps: dict[str, Any] = {"updated_at": now}
        if to == StudyState.RUNNING:
            stamps["started_at"] = now
        if to in TERMINAL:
            stamps["finished_at"] = now
        statement = (
            update(Study)
            .where(Study.id == study_id, Study.state.in_(allowed))
            .values(state=to, **stamps, **values)
            .execution_options(synchronize_session=False)
        )
        fenced = fence_clause(fence)
        if fenced is not None:
            statement = statement.where(fenced)
        changed = self.session.execute(statement).rowcount == 1
        if changed:
            self.session.expire_all()
        return changed

    def set_queued_reason(self, study_id: str, reason: str | None) -> None:
        """Why a queued study waits (no state change, no ``updated_at`` bump)."""
        self.session.execute(
            update(Study)
            .where(Study.id == study_id, Study.state == StudyState.QUEUED)
            .values(queued_reason=reason)
            .execution_options(synchronize_session=False)
        )

    def update_study(self, study_id: str, **values: Any) -> None:
        """Set columns other than ``state`` (heartbeat, MLflow ids, driver reference …)."""
        if "state" in values:
            raise ValueError("use transition() to change a study's state")
        values = _scrub_error(values)
        statement = update(Study).where(Study.id == study_id).values(**values)
        self.session.execute(statement.execution_options(synchronize_session=False))
        self.session.expire_all()

    # ---------------------------------------------------------------- trials

    def get_trial(self, study_id: str, number: int, *, lock: bool = False) -> Trial | None:
        query = select(Trial).where(Trial.study_id == study_id, Trial.number == number)
        return self.session.scalars(query.with_for_update() if lock else query).first()

    def require_trial(self, study_id: str, number: int) -> Trial:
        trial = self.get_trial(study_id, number)
        if trial is None:
            raise TrialNotFoundError(f"study {study_id!r} has no trial {number}")
        return trial

    def start_trial(
        self,
        study_id: str,
        number: int,
        params: Mapping[str, Any],
        mlflow_run_id: str | None = None,
    ) -> Trial:
        """Create trial ``number`` (or refresh it: a resumed driver may report it again)."""
        trial = self.get_trial(study_id, number, lock=True)
        if trial is None:
            trial = Trial(study_id=study_id, number=number, state=TrialState.RUNNING, params={})
            self.session.add(trial)
        trial.params = json_safe(dict(params))
        if mlflow_run_id:
            trial.mlflow_run_id = mlflow_run_id
        if trial.state not in _TRIAL_DONE:
            trial.state = TrialState.RUNNING
        self.session.flush()
        return trial

    def record_round(
        self, study_id: str, number: int, round_: int, metrics: Mapping[str, Any]
    ) -> None:
        """Store one round of trial ``number`` (replacing a round reported before)."""
        trial = self.get_trial(study_id, number, lock=True) or self.start_trial(
            study_id, number, {}
        )
        row = self.session.get(TrialRound, (trial.id, round_))
        if row is None:
            self.session.add(
                TrialRound(trial_id=trial.id, round=round_, metrics=json_safe(metrics))
            )
        else:
            row.metrics = json_safe(dict(metrics))
        trial.last_round = max(trial.last_round or 0, round_)
        self.session.flush()

    def finish_trial(
        self,
        study_id: str,
        number: int,
        state: TrialState,
        value: float | None = None,
        outcome: str | None = None,
    ) -> Trial:
        trial = self.get_trial(study_id, number, lock=True) or self.start_trial(
            study_id, number, {}
        )
        trial.state = TrialState(state)
        trial.value = _finite(value)
        trial.outcome = None if outcome is None else str(outcome)  # a plain string, as stored
        trial.finished_at = utcnow()
        self.session.flush()
        return trial

    def kill_running_trials(self, study_id: str) -> list[Trial]:
        """Mark the study's running trials ``killed`` (cancel, or a driver that died)."""
        query = select(Trial).where(Trial.study_id == study_id, Trial.state == TrialState.RUNNING)
        trials = list(self.session.scalars(query.with_for_update()))
        now = utcnow()
        for trial in trials:
            trial.state, trial.finished_at = TrialState.KILLED, now
        self.session.flush()
        return trials

    def delete_trials(self, study_id: str) -> int:
        """Forget a study's trials (its Optuna storage was lost: the study restarts)."""
        trials = list(self.session.scalars(select(Trial).where(Trial.study_id == study_id)))
        for trial in trials:
            self.session.delete(trial)
        self.session.flush()
        return len(trials)

    def list_trials(self, study_id: str, state: TrialState | None = None) -> list[Trial]:
        query = select(Trial).where(Trial.study_id == study_id)
        if state is not None:
            query = query.where(Trial.state == state)
        return list(self.session.scalars(query.order_by(Trial.number)))

    def trial_counts(self, study_id: str) -> dict[TrialState, int]:
        return self.trial_progress(study_id)[0]

    def trial_progress(self, study_id: str) -> tuple[dict[TrialState, int], int]:
        """The study's trials by state and the configuration-rounds they trained (the sum of
        their last rounds), in one index range read of its trials."""
        query = (
            select(Trial.state, func.count(), func.coalesce(func.sum(Trial.last_round), 0))
            .where(Trial.study_id == study_id)
            .group_by(Trial.state)
        )
        counts, rounds = dict.fromkeys(TrialState, 0), 0
        for state, n, trained in self.session.execute(query):
            counts[TrialState(state)] = int(n)
            rounds += int(trained)
        return counts, rounds

    def best_completed(self, study_id: str, maximise: bool) -> Trial | None:
        """The completed, scored, not diverged trial with the best value (lowest number among
        equals): one index range read of the study's trials, sorted in SQL."""
        value = Trial.value.desc() if maximise else Trial.value.asc()
        query = (
            select(Trial)
            .where(
                Trial.study_id == study_id,
                Trial.state == TrialState.COMPLETED,
                Trial.value.is_not(None),
                or_(Trial.outcome.is_(None), Trial.outcome != TrialOutcome.DIVERGED.value),
            )
            .order_by(value, Trial.number)
            .limit(1)
        )
        return self.session.scalars(query).first()

    def running_trials_total(self) -> int:
        query = (
            select(func.count())
            .select_from(Trial)
            .join(Study, Study.id == Trial.study_id)
            .where(Trial.state == TrialState.RUNNING, Study.state == StudyState.RUNNING)
        )
        return int(self.session.scalar(query) or 0)

    def curve(self, study_id: str, number: int) -> list[TrialRound]:
        trial = self.require_trial(study_id, number)
        query = select(TrialRound).where(TrialRound.trial_id == trial.id)
        return list(self.session.scalars(query.order_by(TrialRound.round)))

    def curves(self, study_id: str) -> dict[int, list[TrialRound]]:
        """Every trial's rounds, by trial number (for the trade-off)."""
        query = (
            select(Trial.number, TrialRound)
            .join(TrialRound, TrialRound.trial_id == Trial.id)
            .where(Trial.study_id == study_id)
            .order_by(Trial.number, TrialRound.round)
        )
        out: dict[int, list[TrialRound]] = {}
        for number, row in self.session.execute(query):
            out.setdefault(int(number), []).append(row)
        return out

    # ---------------------------------------------------------------- idempotency

    def get_idempotency(self, key: str) -> IdempotencyKey | None:
        return self.session.get(IdempotencyKey, key)

    def put_idempotency(self, key: str, request_hash: str, study_id: str) -> None:
        self.session.add(IdempotencyKey(key=key, request_hash=request_hash, study_id=study_id))
        self.session.flush()

    # ---------------------------------------------------------------- code packages

    def has_code_package(self, sha256: str) -> bool:
        query = select(CodePackageRow.sha256).where(CodePackageRow.sha256 == sha256)
        return self.session.scalar(query) is not None

    def put_code_package(self, sha256: str, data: bytes) -> bool:
        """Store a package under its digest; False when it was stored already (content
        addressing: identical code is one row)."""
        if self.has_code_package(sha256):
            return False
        self.session.add(CodePackageRow(sha256=sha256, size=len(data), data=data))
        self.session.flush()
        return True

    def own_code_package(self, sha256: str, project: str) -> None:
        """Record that ``project`` uploaded package ``sha256`` (idempotent)."""
        if self.session.get(CodePackageOwner, (sha256, project)) is None:
            self.session.add(CodePackageOwner(sha256=sha256, project=project))
            self.session.flush()

    def owns_code_package(self, sha256: str, project: str) -> bool:
        return self.session.get(CodePackageOwner, (sha256, project)) is not None

    def get_code_package(self, sha256: str) -> bytes | None:
        row = self.session.get(CodePackageRow, sha256)
        return None if row is None else bytes(row.data)


def _scrub_error(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with :func:`fedtune.redact.scrub_text` on a study's ``error``, if any.

    Args:
        values: The columns to set.

    Returns:
        The same columns; ``error`` without any URI's user or password.
    """
    if isinstance(values.get("error"), str):
        return {**values, "error": scrub_text(values["error"])}
    return values
