"""One conformance suite for the repository, run on every storage backend (SQLite, PostgreSQL).

Optuna's lesson (``optuna/testing/pytest_storages.py``): a storage is correct when the same
behavioural checks pass on each backend. PostgreSQL runs in a fresh schema per test and is
skipped (with the reason printed) when the server cannot be reached.
"""

from __future__ import annotations

import datetime as dt
import math
import threading
import time

import pytest
from sqlalchemy import delete, func, select

from fedtune.errors import ConflictError
from fedtune.service.db import Database
from fedtune.service.errors import (
    DatabaseUnavailableError,
    IllegalStateChangeError,
    StudyNotFoundError,
    TrialNotFoundError,
)
from fedtune.service.models import Study, Trial, TrialRound, utcnow
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState


def _study(study_id: str, created: dt.datetime | None = None, **kw) -> Study:
    values = dict(
        id=study_id,
        name=f"s-{study_id}",
        state=StudyState.QUEUED,
        spec={"name": "s"},
        algorithm="fedavg",
        task="quadratic",
        trials_requested=4,
        attempts=0,
    )
    if created is not None:
        values["created_at"] = created
    return Study(**(values | kw))


def _add(db: Database, *studies: Study) -> None:
    with db.session() as s:
        for study in studies:
            Repository(s).add_study(study)


def _ids(n: int) -> list[str]:
    return [f"{i:012x}" for i in range(1, n + 1)]


# ---------------------------------------------------------------- studies


def test_add_get_and_require(database: Database) -> None:
    _add(database, _study("000000000001"))
    with database.session(readonly=True) as s:
        repo = Repository(s)
        got = repo.get_study("000000000001")
        assert got is not None and got.state == StudyState.QUEUED and got.spec == {"name": "s"}
        assert got.created_at.tzinfo is not None and got.created_at.utcoffset() == dt.timedelta(0)
        assert repo.get_study("ffffffffffff") is None
        with pytest.raises(StudyNotFoundError):
            repo.require_study("ffffffffffff")


def test_list_is_newest_first_paginated_and_filtered(database: Database) -> None:
    t0 = utcnow()
    ids = _ids(5)
    _add(database, *[_study(i, t0 + dt.timedelta(seconds=k)) for k, i in enumerate(ids)])
    with database.session() as s:
        assert Repository(s).transition(ids[1], StudyState.RUNNING)
    with database.session(readonly=True) as s:
        repo = Repository(s)
        page, total = repo.page_studies(limit=2, offset=0), repo.count_studies()
        assert [p.id for p in page] == [ids[4], ids[3]] and total == 5
        page, total = repo.page_studies(limit=2, offset=4), repo.count_studies()
        assert [p.id for p in page] == [ids[0]] and total == 5
        queued = (StudyState.QUEUED,)
        page, total = repo.page_studies(queued, limit=10), repo.count_studies(queued)
        assert [p.id for p in page] == [ids[4], ids[3], ids[2], ids[0]] and total == 4
        assert [p.id for p in repo.studies_in(StudyState.QUEUED, limit=2)] == [ids[0], ids[2]]
        counts = repo.count_by_state()
        assert counts == {
            **dict.fromkeys(StudyState, 0),
            StudyState.QUEUED: 4,
            StudyState.RUNNING: 1,
        }


def test_transition_is_compare_and_set(database: Database) -> None:
    _add(database, _study("000000000001"))
    with database.session() as s:
        repo = Repository(s)
        assert repo.transition("000000000001", StudyState.RUNNING, attempts=1, driver_ref={"p": 1})
        assert not repo.transition("000000000001", StudyState.RUNNING, expected=[StudyState.QUEUED])
    with database.session(readonly=True) as s:
        study = Repository(s).require_study("000000000001")
        assert study.state == StudyState.RUNNING and study.attempts == 1
        assert study.driver_ref == {"p": 1} and study.started_at is not None
        assert study.finished_at is None
    with database.session() as s:
        assert Repository(s).transition("000000000001", StudyState.SUCCEEDED)
    with database.session(readonly=True) as s:
        assert Repository(s).require_study("000000000001").finished_at is not None
    with database.session() as s, pytest.raises(IllegalStateChangeError):
        Repository(s).transition(
            "000000000001", StudyState.RUNNING, expected=[StudyState.SUCCEEDED]
        )
    with database.session() as s:  # no legal source state holds: nothing changes
        assert not Repository(s).transition("000000000001", StudyState.CANCELLED)


def test_update_study_refuses_state_changes(database: Database) -> None:
    _add(database, _study("000000000001"))
    with database.session() as s:
        Repository(s).update_study("000000000001", heartbeat_at=utcnow(), mlflow_run_id="a" * 32)
        with pytest.raises(ValueError, match="transition"):
            Repository(s).update_study("000000000001", state=StudyState.FAILED)
    with database.session(readonly=True) as s:
        study = Repository(s).require_study("000000000001")
        assert study.heartbeat_at is not None and study.mlflow_run_id == "a" * 32


# ---------------------------------------------------------------- trials


def test_trials_are_keyed_by_number(database: Database) -> None:
    _add(database, _study("000000000001"))
    with database.session() as s:
        repo = Repository(s)
        repo.start_trial("000000000001", 0, {"hparams.client_lr": 0.1})
        repo.start_trial("000000000001", 0, {"hparams.client_lr": 0.2}, mlflow_run_id="r" * 32)
        repo.finish_trial("000000000001", 0, TrialState.COMPLETED, 1.5, "completed")
        repo.start_trial("000000000001", 0, {"hparams.client_lr": 0.2})  # a resumed driver
        repo.start_trial("000000000001", 1, {"hparams.client_lr": 0.3})
    with database.session(readonly=True) as s:
        repo = Repository(s)
        trials = repo.list_trials("000000000001")
        assert [t.number for t in trials] == [0, 1]
        assert trials[0].state == TrialState.COMPLETED and trials[0].value == 1.5
        assert (
            trials[0].params == {"hparams.client_lr": 0.2} and trials[0].mlflow_run_id == "r" * 32
        )
        assert [t.number for t in repo.list_trials("000000000001", TrialState.RUNNING)] == [1]
        counts = repo.trial_counts("000000000001")
        assert counts[TrialState.COMPLETED] == 1 and counts[TrialState.RUNNING] == 1
        with pytest.raises(TrialNotFoundError):
            repo.require_trial("000000000001", 7)


def test_rounds_upsert_and_sanitise(database: Database) -> None:
    _add(database, _study("000000000001"))
    with database.session() as s:
        repo = Repository(s)
        repo.record_round("000000000001", 3, 1, {"client_loss": 2.0})  # creates trial 3
        repo.record_round("000000000001", 3, 2, {"client_loss": math.inf, "x": [math.nan, 1.0]})
        repo.record_round("000000000001", 3, 1, {"client_loss": 1.5})  # replayed round
        repo.finish_trial("000000000001", 3, TrialState.COMPLETED, math.inf, "diverged")
    with database.session(readonly=True) as s:
        repo = Repository(s)
        rows = repo.curve("000000000001", 3)
        assert [(r.round, r.metrics) for r in rows] == [
            (1, {"client_loss": 1.5}),
            (2, {"client_loss": None, "x": [None, 1.0]}),
        ]
        trial = repo.require_trial("000000000001", 3)
        assert trial.last_round == 2 and trial.value is None and trial.outcome == "diverged"
        assert list(repo.curves("000000000001")) == [3]
        count = s.scalar(select(func.count()).select_from(TrialRound))
        assert count == 2


def test_kill_running_and_running_total(database: Database) -> None:
    _add(database, _study("000000000001"), _study("000000000002"))
    with database.session() as s:
        repo = Repository(s)
        repo.transition("000000000001", StudyState.RUNNING)
        for n in range(3):
            repo.start_trial("000000000001", n, {})
            repo.start_trial("000000000002", n, {})  # a queued study's leftovers: not counted
        repo.finish_trial("000000000001", 0, TrialState.COMPLETED, 1.0, "completed")
    with database.session(readonly=True) as s:
        assert Repository(s).running_trials_total() == 2
    with database.session() as s:
        killed = Repository(s).kill_running_trials("000000000001")
        assert sorted(t.number for t in killed) == [1, 2]
    with database.session(readonly=True) as s:
        repo = Repository(s)
        assert repo.running_trials_total() == 0
        states = [t.state for t in repo.list_trials("000000000001")]
        assert states == [TrialState.COMPLETED, TrialState.KILLED, TrialState.KILLED]


def test_delete_trials_and_cascade(database: Database) -> None:
    _add(database, _study("000000000001"), _study("000000000002"))
    with database.session() as s:
        repo = Repository(s)
        for sid in ("000000000001", "000000000002"):
            repo.record_round(sid, 0, 1, {"client_loss": 1.0})
        repo.put_idempotency("key-1", "h" * 64, "000000000002")
    with database.session() as s:
        assert Repository(s).delete_trials("000000000001") == 1
    with database.session() as s:  # the database itself cascades (ON DELETE CASCADE)
        s.execute(delete(Study).where(Study.id == "000000000002"))
    with database.session(readonly=True) as s:
        assert s.scalar(select(func.count()).select_from(Trial)) == 0
        assert s.scalar(select(func.count()).select_from(TrialRound)) == 0
        assert Repository(s).get_idempotency("key-1") is None


# ---------------------------------------------------------------- idempotency keys, boundary


def test_idempotency_keys(database: Database) -> None:
    _add(database, _study("000000000001"))
    with database.session() as s:
        Repository(s).put_idempotency("k", "a" * 64, "000000000001")
    with database.session(readonly=True) as s:
        seen = Repository(s).get_idempotency("k")
        assert seen is not None and seen.study_id == "000000000001"
    with pytest.raises(ConflictError), database.session() as s:
        Repository(s).put_idempotency("k", "b" * 64, "000000000001")


def test_boundary_rolls_back_and_translates(database: Database) -> None:
    with pytest.raises(RuntimeError), database.session() as s:
        Repository(s).add_study(_study("000000000001"))
        raise RuntimeError("boom")
    with database.session(readonly=True) as s:
        assert Repository(s).get_study("000000000001") is None
    _add(database, _study("000000000001"))
    with pytest.raises(ConflictError):  # duplicate primary key → 409, not a raw IntegrityError
        _add(database, _study("000000000001"))
    with pytest.raises(ConflictError), database.session() as s:
        s.add(Trial(study_id="000000000001", number=0, state=TrialState.RUNNING, params={}))
        s.add(Trial(study_id="000000000001", number=0, state=TrialState.RUNNING, params={}))
        s.flush()
    with database.session(readonly=True) as s:
        assert Repository(s).list_trials("000000000001") == []


def test_a_writer_waits_for_another(database: Database) -> None:
    """Two engines (the service and a driver) writing at once: the second waits, never fails."""
    _add(database, _study("000000000001"))
    other = Database(database.url)
    held = threading.Event()
    errors: list[BaseException] = []

    def slow_writer() -> None:
        try:
            with database.session() as s:
                Repository(s).update_study("000000000001", error="first")
                held.set()
                time.sleep(0.5)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert held.wait(5)
    with other.session() as s:
        Repository(s).start_trial("000000000001", 0, {})
        Repository(s).update_study("000000000001", error="second")
    thread.join()
    other.dispose()
    assert not errors
    with database.session(readonly=True) as s:
        assert Repository(s).require_study("000000000001").error == "second"


def test_unreachable_database_is_a_503_error(tmp_path) -> None:
    for url in (
        f"sqlite:///{tmp_path / 'missing' / 'dir' / 'x.db'}",
        "postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2",
    ):
        db = Database(url)
        with pytest.raises(DatabaseUnavailableError) as err:
            db.ping()
        assert "127.0.0.1" not in str(err.value) and "x.db" not in str(err.value)
        db.dispose()
