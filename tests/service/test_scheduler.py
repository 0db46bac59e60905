"""Scheduler and reconciliation against a scripted backend."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from fedtune.errors import BackendError
from fedtune.service.backends.base import DriverStatus
from fedtune.service.db import Database
from fedtune.service.models import Study, utcnow
from fedtune.service.reconcile import reconcile_running
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, cancel_study, submit_study
from fedtune.service.states import StudyState, TrialState

from .helpers import FakeBackend, tiny_spec


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(sqlite_db: Database, make_settings: Callable, fake_backend: FakeBackend):
    settings = make_settings(database_url=sqlite_db.url, max_concurrent_studies=2)
    clock = Clock()
    scheduler = Scheduler(sqlite_db, fake_backend, settings, clock=clock)
    ctx = ServiceContext(sqlite_db, settings, scheduler)
    return ctx, scheduler, fake_backend, clock


def _submit(ctx: ServiceContext, n: int = 1, **kw) -> list[str]:
    return [submit_study(ctx, tiny_spec(name=f"s{i}", **kw))[0].id for i in range(n)]


def _study(ctx: ServiceContext, study_id: str) -> Study:
    with ctx.db.session(readonly=True) as s:
        return Repository(s).require_study(study_id)


def test_dispatch_respects_the_global_limit_fifo(setup) -> None:
    ctx, scheduler, backend, _ = setup
    ids = _submit(
        ctx, 4, resources={"cpu": 0.5, "gpu": 0.25}, budget={"trials": 2, "max_concurrent": 3}
    )
    assert scheduler.tick().dispatched == ids[:2]
    assert scheduler.tick().dispatched == []  # still two running
    request = backend.launched[0]
    assert (request.study_id, request.attempt) == (ids[0], 1)
    assert (request.cpu, request.gpu, request.max_concurrent) == (0.5, 0.25, 3)
    study = _study(ctx, ids[0])
    assert study.state == StudyState.RUNNING and study.attempts == 1 and study.backend == "local"
    assert study.driver_ref == {"study": ids[0], "attempt": 1}
    with ctx.db.session() as s:  # the driver of ids[0] finished and said so
        Repository(s).transition(ids[0], StudyState.SUCCEEDED)
    backend.finish(ids[0], 1, DriverStatus.SUCCEEDED)
    report = scheduler.tick()
    assert report.recovered == [] and report.dispatched == [ids[2]]
    assert _study(ctx, ids[0]).state == StudyState.SUCCEEDED


def test_a_dead_driver_is_redispatched_then_failed(setup) -> None:
    ctx, scheduler, backend, _ = setup
    [sid] = _submit(ctx)
    scheduler.tick()
    with ctx.db.session() as s:
        Repository(s).start_trial(sid, 0, {})
        Repository(s).finish_trial(sid, 1, TrialState.COMPLETED, 1.0, "completed")
    for attempt in (1, 2):
        backend.finish(sid, attempt, DriverStatus.GONE if attempt == 1 else DriverStatus.FAILED)
        report = scheduler.tick()
        assert [r.action for r in report.recovered] == ["requeued"]
        assert report.dispatched == [sid]
        study = _study(ctx, sid)
        assert study.state == StudyState.RUNNING and study.attempts == attempt + 1
    with ctx.db.session(readonly=True) as s:  # the interrupted trial is killed, the done one kept
        states = {t.number: t.state for t in Repository(s).list_trials(sid)}
    assert states == {0: TrialState.KILLED, 1: TrialState.COMPLETED}
    backend.finish(sid, 3, DriverStatus.GONE)
    report = scheduler.tick()
    assert [r.action for r in report.recovered] == ["failed"]
    study = _study(ctx, sid)
    assert study.state == StudyState.FAILED and "gave up after 3 attempts" in study.error


def test_refused_launch_requeues_without_spending_an_attempt(setup) -> None:
    ctx, scheduler, backend, clock = setup
    [sid] = _submit(ctx)
    backend.refuse_launch = True
    assert scheduler.tick().dispatched == []
    study = _study(ctx, sid)
    assert study.state == StudyState.QUEUED and study.attempts == 0
    assert "cluster unreachable" in study.error
    backend.refuse_launch = False
    assert scheduler.tick().dispatched == []  # backing off
    clock.now += 1.5
    assert scheduler.tick().dispatched == [sid]
    assert _study(ctx, sid).attempts == 1


def test_unknown_driver_status_changes_nothing(setup) -> None:
    ctx, scheduler, backend, _ = setup
    [sid] = _submit(ctx)
    scheduler.tick()
    backend.poll_error = True
    assert scheduler.tick().recovered == []
    assert _study(ctx, sid).state == StudyState.RUNNING


def test_cancel_stops_the_driver_and_marks_runs(setup) -> None:
    ctx, scheduler, backend, _ = setup
    killed: list = []
    scheduler._kill_runs = lambda *args: killed.append(args)
    [sid] = _submit(ctx)
    scheduler.tick()
    with ctx.db.session() as s:
        Repository(s).start_trial(sid, 0, {}, mlflow_run_id="b" * 32)
        Repository(s).update_study(sid, mlflow_run_id="a" * 32, mlflow_experiment_id="7")
    original = backend.stop
    calls = {"n": 0}

    def flaky_stop(ref) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise BackendError("API hiccup")
        original(ref)

    backend.stop = flaky_stop
    assert cancel_study(ctx, sid).state == StudyState.CANCELLED
    assert scheduler.tick().stopped == []  # failed once: retried on the next tick
    assert scheduler.tick().stopped == [sid]
    assert backend.stopped == [{"study": sid, "attempt": 1}]
    uri, experiment, parent, runs = killed[-1]
    assert (experiment, parent, runs) == ("7", "a" * 32, ["b" * 32])
    assert uri.endswith(f"studies/{sid}/mlflow.db")
    assert scheduler.tick().recovered == []  # a cancelled study is never re-dispatched


def _started_ago(ctx: ServiceContext, study_id: str, seconds: float) -> None:
    with ctx.db.session() as s:
        Repository(s).update_study(study_id, started_at=utcnow() - timedelta(seconds=seconds))


def test_a_study_past_its_budget_and_grace_fails_and_its_driver_stops(setup) -> None:
    ctx, scheduler, backend, _ = setup
    scheduler.settings = ctx.settings.model_copy(update={"study_deadline_grace_s": 60})
    [sid] = _submit(ctx, budget={"trials": 2, "time": "30s"})
    [other] = _submit(ctx)
    scheduler.tick()
    with ctx.db.session() as s:
        Repository(s).start_trial(sid, 0, {})
    _started_ago(ctx, sid, 89)
    _started_ago(ctx, other, 89)
    assert scheduler.tick().late == []  # 89 s < 30 s + 60 s
    _started_ago(ctx, sid, 91)
    report = scheduler.tick()
    assert (report.late, report.stopped) == ([sid], [sid])
    study = _study(ctx, sid)
    assert study.state == StudyState.FAILED
    assert study.error == (
        "the study ran past its deadline of 90 s (budget.time 30 s + "
        "FEDTUNE_STUDY_DEADLINE_GRACE_S 60 s); its driver was stopped"
    )
    with ctx.db.session(readonly=True) as s:
        assert [t.state for t in Repository(s).list_trials(sid)] == [TrialState.KILLED]
    assert backend.stopped == [{"study": sid, "attempt": 1}]
    assert _study(ctx, other).state == StudyState.RUNNING  # no budget: a week by default
    assert scheduler.tick().recovered == []  # never re-dispatched


def test_the_service_deadline_bounds_every_study_and_zero_lifts_it(setup) -> None:
    ctx, scheduler, _, _ = setup
    [sid] = _submit(ctx, budget={"trials": 2, "wall_clock_s": 10**5})  # the old name of time
    scheduler.tick()
    scheduler.settings = ctx.settings.model_copy(update={"study_deadline_s": 0})
    _started_ago(ctx, sid, 10**5)
    assert scheduler.tick().late == []
    scheduler.settings = ctx.settings.model_copy(update={"study_deadline_s": 3600})
    assert scheduler.tick().late == [sid]
    assert "deadline of 3600 s (FEDTUNE_STUDY_DEADLINE_S)" in _study(ctx, sid).error


def test_reconcile_at_start(setup) -> None:
    ctx, _, backend, _ = setup
    alive, never, elsewhere = _submit(ctx, 3)
    with ctx.db.session() as s:
        repo = Repository(s)
        repo.transition(
            alive,
            StudyState.RUNNING,
            attempts=1,
            backend="local",
            driver_ref={"study": alive, "attempt": 1},
        )
        repo.transition(never, StudyState.RUNNING, attempts=1, backend="local")
        repo.transition(
            elsewhere,
            StudyState.RUNNING,
            attempts=1,
            backend="kubernetes",
            driver_ref={"name": "x"},
        )
    backend.finish(alive, 1, DriverStatus.RUNNING)
    actions = {r.study_id: r.action for r in reconcile_running(ctx.db, backend, 3)}
    assert actions == {never: "requeued", elsewhere: "failed"}
    assert _study(ctx, alive).state == StudyState.RUNNING  # adopted
    assert _study(ctx, never).state == StudyState.QUEUED
    assert "backend 'kubernetes'" in _study(ctx, elsewhere).error


def test_the_thread_dispatches_on_its_own(setup) -> None:
    ctx, scheduler, backend, _ = setup
    scheduler.start()
    try:
        [sid] = _submit(ctx)
        deadline = time.monotonic() + 5
        while not backend.launched and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [r.study_id for r in backend.launched] == [sid]
    finally:
        scheduler.stop()
    assert not scheduler._thread.is_alive()
