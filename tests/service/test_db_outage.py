"""A service-database outage during a study is not the study's failure.

It used to count as one of the study's dispatch attempts (a ``DatabaseUnavailableError`` was a
permanent error: the driver failed the study, or, the write failing too, died and was re-queued
by the reconciler with the attempt used up), so three outages failed a healthy study. Now the
driver waits until the database answers, then re-queues the study with the attempt given back.
The outage is a real one: SQLAlchemy's ``OperationalError`` from a PostgreSQL port that answers
nothing, translated by the service's own ``Database`` as every write path does.
"""

from __future__ import annotations

import pytest

from fedtune.errors import DatabaseUnavailableError
from fedtune.service.db import Database
from fedtune.service.driver import EXIT_REQUEUED, run_driver
from fedtune.service.faults import is_database_outage, is_transient
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState
from tests.ports import free_port

from .helpers import running_study


def _real_outage() -> DatabaseUnavailableError:
    """What a write raises while PostgreSQL is down (connection refused), as the sink sees it."""
    down = Database(f"postgresql+psycopg://fedtune@127.0.0.1:{free_port()}/gone")
    try:
        down.ping()
    except DatabaseUnavailableError as exc:
        return exc
    finally:
        down.dispose()
    raise AssertionError("a closed port answered")


def test_an_outage_is_recognised_through_the_error_chain() -> None:
    exc = _real_outage()
    assert is_database_outage(exc) and not is_transient(exc)
    try:
        raise RuntimeError("Tune callback failed") from exc
    except RuntimeError as wrapped:
        assert is_database_outage(wrapped)
    assert not is_database_outage(ValueError("x"))


def test_three_outages_never_fail_the_study_nor_use_up_its_attempts(ctx, monkeypatch) -> None:
    assert ctx.settings.max_dispatch_attempts <= 3
    sid = running_study(ctx)
    outage = _real_outage()
    pings = []
    real_ping = ctx.db.ping

    def ping() -> None:  # the database comes back after two failed pings
        pings.append(1)
        if len(pings) <= 2:
            raise outage
        real_ping()

    monkeypatch.setattr(ctx.db, "ping", ping)
    monkeypatch.setattr("fedtune.service.db.Database", lambda url: ctx.db)
    monkeypatch.setattr(ctx.db, "dispose", lambda: None)
    slept: list[float] = []

    def run_study(*args, **kwargs):
        raise RuntimeError("a Tune callback failed") from outage

    for dispatch in range(3):  # three outages, each on a fresh dispatch of attempt 1
        code = run_driver(sid, ctx.settings, 1, run_study=run_study, sleep=slept.append)
        assert code == EXIT_REQUEUED
        with ctx.db.session() as s:
            repo = Repository(s)
            study = repo.require_study(sid)
            assert study.state == StudyState.QUEUED, study.error
            assert study.attempts == 0 and "not counted" in study.error
            repo.transition(sid, StudyState.RUNNING, attempts=1)  # the scheduler's next dispatch
        if dispatch == 0:
            assert len(slept) == 2 and slept[1] > slept[0]  # waited for the database, backing off
    with ctx.db.session(readonly=True) as s:
        assert Repository(s).require_study(sid).state == StudyState.RUNNING


def test_a_database_that_never_returns_gives_up_waiting(ctx) -> None:
    from fedtune.service.driver import _wait_for_database
    from fedtune.service.driver_link import DbLink

    down = DbLink(Database(f"postgresql+psycopg://fedtune@127.0.0.1:{free_port()}/gone"), "s1", 3)
    slept: list[float] = []
    try:
        with pytest.raises(DatabaseUnavailableError):
            _wait_for_database(down, ctx.settings, slept.append, limit_s=5.0)
    finally:
        down.close()
    assert sum(slept) >= 5.0 and max(slept) <= 30.0


def test_a_service_that_does_not_answer_is_waited_for_like_a_database(ctx) -> None:
    """A driver that reports through the API and finds nothing listening treats it as an
    outage of the service: it waits and backs off, as for the database, then gives up."""
    from fedtune.service.driver import _wait_for_database
    from fedtune.service.driver_link import ApiLink

    gone = ApiLink(f"http://127.0.0.1:{free_port()}", "0123456789ab", "ftd.1." + "0" * 64)
    slept: list[float] = []
    try:
        with pytest.raises(DatabaseUnavailableError, match="did not answer"):
            _wait_for_database(gone, ctx.settings, slept.append, limit_s=5.0)
    finally:
        gone.close()
    assert sum(slept) >= 5.0 and max(slept) <= 30.0
