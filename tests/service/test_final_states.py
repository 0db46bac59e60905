"""Honest final states, through the real driver and a real Optuna storage.

* a study whose trials all failed ends ``failed`` with the first trial's error as its reason
  (it used to end ``succeeded`` with ``error: null``);
* a cancelled study leaves no ``WAITING`` trial in its Optuna storage (re-enqueued interrupted
  trials and queued grid points used to stay there); a study that is only re-dispatched keeps
  its queue, since it resumes from it.

The end-to-end case with real Ray trials that raise is ``tests/integration/test_study_failures.py``.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import optuna
import pytest

from fedtune.service.db import Database
from fedtune.service.driver import EXIT_STOPPED, run_driver
from fedtune.service.paths import study_workdir
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, cancel_study, submit_study
from fedtune.service.states import StudyState, TrialState
from fedtune.tuning.driver.failures import (
    FIRST_ERROR_ATTR,
    FirstErrorCallback,
    first_error,
    no_best_reason,
)
from fedtune.tuning.driver.study import StudyResult
from fedtune.tuning.optuna import search as og
from fedtune.tuning.optuna.store import StudyStore

from .helpers import FakeBackend, running_study, tiny_spec

WAITING = optuna.trial.TrialState.WAITING


def _result(counts: dict[str, int], error: str | None, best: dict | None = None) -> StudyResult:
    """What run_study returns: ``failure`` by the real rule (``no_best_reason``) when no best."""
    study = optuna.create_study()
    if error:
        study.set_user_attr(FIRST_ERROR_ATTR, {"trial": 0, "error": error.split(": ", 1)[1]})
    return StudyResult(
        name="tiny",
        workdir="w",
        storage_url="sqlite://",
        tracking_uri="t",
        experiment_id="3",
        parent_run_id="c" * 32,
        target_trials=counts["trials"],
        configuration_rounds=4 * counts["trials"],
        finished=counts["trials"],
        ran=counts["trials"],
        counts=counts,
        best=best,
        pareto=[],
        tradeoff=None,
        artifacts={},
        first_error=error,
        failure=None if best else no_best_reason(study, counts),
    )


def _counts(**outcomes: int) -> dict[str, int]:
    counts = dict.fromkeys(("completed", "diverged", "stopped", "failed", "interrupted"), 0)
    counts.update(outcomes)
    counts["trials"] = sum(v for k, v in outcomes.items() if k != "interrupted")
    return counts


def test_a_study_whose_trials_all_failed_ends_failed_with_the_first_error(ctx) -> None:
    sid = running_study(ctx)
    error = "trial 0: TrialError: DataError: /data/x.h5: not an HDF5 file"

    def all_fail(*args, **kwargs):
        return _result(_counts(failed=2, interrupted=1), error)

    assert run_driver(sid, ctx.settings, 1, run_study=all_fail) == 1
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.FAILED
    assert study.error == f"all 2 trials failed; {error}"
    assert study.mlflow_run_id == "c" * 32  # the runs stay reachable from the failed study


def test_a_study_with_a_best_configuration_succeeds(ctx) -> None:
    sid = running_study(ctx)
    best = {"number": 2, "value": 0.5, "values": {"objective": 0.5}, "params": {}}
    result = _result(_counts(failed=2, completed=1), "trial 0: x", best=best)
    assert run_driver(sid, ctx.settings, 1, run_study=lambda *a, **k: result) == 0
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.SUCCEEDED and study.error is None
    assert (study.best_trial, study.best_value) == (2, 0.5)


@pytest.mark.parametrize(
    ("counts", "reason"),
    [
        (_counts(diverged=2), "all 2 trials diverged"),
        (_counts(failed=1, stopped=1), "no trial completed (1 failed, 1 stopped)"),
        (_counts(stopped=3), "all 3 trials were stopped"),
        (_counts(), "no trial finished"),
    ],
)
def test_a_study_without_a_best_configuration_fails_with_why(ctx, counts, reason) -> None:
    """Diverged or stopped trials ran to an end, but no configuration has a
    finite value: the study fails (it used to succeed with ``best: -``)."""
    sid = running_study(ctx)
    assert run_driver(sid, ctx.settings, 1, run_study=lambda *a, **k: _result(counts, None)) == 1
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.FAILED and study.error == reason


def test_the_reason_names_the_first_trial_that_diverged() -> None:
    study = optuna.create_study()
    for number, (outcome, reason) in enumerate(
        [("diverged", "round 2: client loss nan"), ("failed", None)]
    ):
        trial = study.ask()
        trial.set_user_attr("outcome", outcome)
        if reason:
            trial.set_user_attr("reason", reason)
        study.tell(
            trial,
            float("inf") if outcome == "diverged" else None,
            state=optuna.trial.TrialState.COMPLETE if reason else optuna.trial.TrialState.FAIL,
        )
        assert trial.number == number
    study.set_user_attr(FIRST_ERROR_ATTR, {"trial": 1, "error": "ValueError: boom"})
    counts = _counts(diverged=1, failed=1)
    assert no_best_reason(study, counts) == (
        "no trial completed (1 diverged, 1 failed); trial 0: round 2: client loss nan"
    )


def test_the_first_trial_error_is_kept_on_the_optuna_study() -> None:
    """The Tune callback keeps the first error's last trace line (as Ray writes error.txt)."""
    study = optuna.create_study()
    callback = FirstErrorCallback(study)
    trace = (
        "Failure # 1 (occurred at 2026-11-23)\nray::ImplicitFunc.train() (pid=1)\n"
        '  File "trainable.py", line 190\n'
        "fedtune.tuning.trials.results.TrialError: DataError: /d/x.h5: not an HDF5 file\n"
    )
    for number, text in ((1, trace), (0, "later: another error")):
        trial = SimpleNamespace(config={"fedtune.trial": number}, get_error=lambda t=text: t)
        callback.on_trial_error(0, [], trial)
    assert study.user_attrs[FIRST_ERROR_ATTR]["trial"] == 1
    assert first_error(study) == (
        "trial 1: DataError: /d/x.h5: not an HDF5 file"  # Ray's TrialError wrapper dropped
    )
    assert first_error(optuna.create_study()) is None


# ---------------------------------------------------------------- cancel: no WAITING trial


def _stopped_while_queued(ctx, sid: str, lose) -> callable:
    """A run_study that leaves what a real one leaves when stopped: an interrupted trial
    re-enqueued and queued points (``WAITING``) in the study's Optuna storage."""

    def run(spec, workdir, *, sinks, **kwargs):
        study = optuna.create_study(study_name=spec.name, storage=og.storage_url(workdir))
        for lr in (0.01, 0.02, 0.03):
            study.enqueue_trial({"hparams.client_lr": lr})
        running = study.ask()  # takes the first queued point
        running.suggest_float("hparams.client_lr", 1e-3, 1.0, log=True)
        lose()
        deadline = time.monotonic() + 30
        try:
            while time.monotonic() < deadline:  # until the heartbeat stops the driver
                time.sleep(0.02)
        except KeyboardInterrupt:
            og.reconcile(study, StudyStore.at(workdir, spec.name))  # as run_study on a stop
            assert running.number == 0
            raise
        raise AssertionError("the driver was not stopped")

    return run


def _storage_states(ctx, sid: str, name: str) -> list:
    storage = og.storage_url(study_workdir(ctx.settings, sid))
    study = optuna.load_study(study_name=name, storage=storage)
    return [(t.state, t.user_attrs.get("outcome")) for t in study.get_trials()]


def test_a_cancelled_study_leaves_no_waiting_trial_in_optuna(ctx) -> None:
    sid = running_study(ctx, name="cancelled")

    def cancel() -> None:
        with ctx.db.session() as s:
            Repository(s).transition(sid, StudyState.CANCELLED)

    run = _stopped_while_queued(ctx, sid, cancel)
    assert run_driver(sid, ctx.settings, 1, run_study=run) == EXIT_STOPPED
    states = _storage_states(ctx, sid, "cancelled")
    assert [s for s, _ in states if s == WAITING] == [], states
    assert states.count((optuna.trial.TrialState.FAIL, "cancelled")) == 3  # 2 queued + 1 requeued
    with ctx.db.session(readonly=True) as s:
        repo = Repository(s)
        assert repo.require_study(sid).state == StudyState.CANCELLED
        trials = [(t.number, t.state) for t in repo.list_trials(sid)]
    assert trials == [(0, TrialState.KILLED)]  # the dropped queue is not shown as trials


def test_a_redispatched_study_keeps_its_queue_to_resume_from(ctx) -> None:
    sid = running_study(ctx, name="moved")

    def supersede() -> None:
        with ctx.db.session() as s:
            Repository(s).update_study(sid, attempts=2)  # re-dispatched elsewhere

    run = _stopped_while_queued(ctx, sid, supersede)
    assert run_driver(sid, ctx.settings, 1, run_study=run) == EXIT_STOPPED
    states = _storage_states(ctx, sid, "moved")
    assert sum(1 for s, _ in states if s == WAITING) == 3, states


def test_the_service_drops_the_queue_of_a_cancelled_study_whose_driver_was_killed(
    sqlite_db: Database, make_settings, fake_backend: FakeBackend
) -> None:
    """A driver killed before it could clean up (SIGKILL after the grace, a deleted pod with a
    shared workdir) leaves WAITING trials; the scheduler drops them once the driver is gone."""
    settings = make_settings(database_url=sqlite_db.url)
    scheduler = Scheduler(sqlite_db, fake_backend, settings)
    ctx = ServiceContext(sqlite_db, settings, stopper=scheduler)
    sid = submit_study(ctx, tiny_spec(name="killed"))[0].id
    scheduler.tick()  # dispatched: a (fake) driver runs
    workdir = study_workdir(settings, sid)
    workdir.mkdir(parents=True)
    study = optuna.create_study(study_name="killed", storage=og.storage_url(workdir))
    for lr in (0.01, 0.02):
        study.enqueue_trial({"hparams.client_lr": lr})  # what the killed driver left queued
    assert cancel_study(ctx, sid).state == StudyState.CANCELLED
    scheduler.tick()  # stops the driver (the fake one is gone at once) and finishes the stop
    assert fake_backend.stopped
    assert [t.state for t in study.get_trials()] == [optuna.trial.TrialState.FAIL] * 2


def _dispatched_with_storage(sqlite_db, make_settings, fake_backend, name, clock=None):
    """A dispatched study (its fake driver running) with its Optuna storage on this workdir:
    (context, scheduler, study id, the Optuna study)."""
    settings = make_settings(database_url=sqlite_db.url)
    extra = {} if clock is None else {"clock": clock}
    scheduler = Scheduler(sqlite_db, fake_backend, settings, **extra)
    ctx = ServiceContext(sqlite_db, settings, stopper=scheduler)
    sid = submit_study(ctx, tiny_spec(name=name))[0].id
    scheduler.tick()
    workdir = study_workdir(settings, sid)
    workdir.mkdir(parents=True)
    study = optuna.create_study(study_name=name, storage=og.storage_url(workdir))
    return ctx, scheduler, sid, study


def test_the_service_ends_the_running_trials_of_a_cancelled_study_whose_driver_was_killed(
    sqlite_db: Database, make_settings, fake_backend: FakeBackend
) -> None:
    """A driver killed during its clean-up leaves its in-flight trial RUNNING in Optuna (the CI
    failure of test_cancel_stops_the_driver_and_kills_mlflow_runs); once the driver is gone the
    scheduler ends it ``FAIL`` / interrupted, as the driver's own clean-up would have."""
    ctx, scheduler, sid, study = _dispatched_with_storage(
        sqlite_db, make_settings, fake_backend, "orphan"
    )
    trial = study.ask()  # in flight when the driver died
    trial.suggest_float("hparams.client_lr", 1e-3, 1.0, log=True)
    study.enqueue_trial({"hparams.client_lr": 0.02})
    assert cancel_study(ctx, sid).state == StudyState.CANCELLED
    scheduler.tick()
    assert fake_backend.stopped
    assert _storage_states(ctx, sid, "orphan") == [
        (optuna.trial.TrialState.FAIL, "interrupted"),
        (optuna.trial.TrialState.FAIL, "cancelled"),
    ]


def test_the_service_leaves_running_trials_alone_while_the_driver_may_live(
    sqlite_db: Database, make_settings, fake_backend: FakeBackend
) -> None:
    """Past the stop deadline with the driver still alive (or its state unknown) the queue is
    dropped but a RUNNING trial is the driver's: it may still tell it."""
    now = [0.0]
    ctx, scheduler, sid, study = _dispatched_with_storage(
        sqlite_db, make_settings, fake_backend, "alive", clock=lambda: now[0]
    )
    study.ask().suggest_float("hparams.client_lr", 1e-3, 1.0, log=True)
    fake_backend.poll_error = True  # the backend cannot tell whether the driver lives
    assert cancel_study(ctx, sid).state == StudyState.CANCELLED
    scheduler.tick()
    assert [s for s, _ in _storage_states(ctx, sid, "alive")] == [optuna.trial.TrialState.RUNNING]
    now[0] += 1e6  # past STOP_WAIT_S
    scheduler.tick()
    assert [s for s, _ in _storage_states(ctx, sid, "alive")] == [optuna.trial.TrialState.RUNNING]
