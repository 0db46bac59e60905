"""The study driver with a stand-in ``run_study`` that plays Ray Tune's callback sequence."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest

from fedtune.errors import ConfigError, RayStartError
from fedtune.service.access import ANONYMOUS_ADMIN
from fedtune.service.backends.base import DriverStatus
from fedtune.service.db import Database
from fedtune.service.driver import EXIT_REQUEUED, EXIT_STOPPED, run_driver
from fedtune.service.faults import is_transient
from fedtune.service.paths import study_workdir
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.states import StudyState, TrialState

from .helpers import running_study, tiny_spec


def _trial(number: int, last_result: dict | None = None) -> SimpleNamespace:
    config = {"fedtune.trial": number, "hparams.client_lr": 0.1 * (number + 1)}
    return SimpleNamespace(config=config, trial_id=f"t{number}", last_result=last_result)


def _rows(*losses: float, start: int = 1) -> list[dict]:
    return [{"round": r, "client_loss": v, "update_norm": 1.0} for r, v in enumerate(losses, start)]


def fake_run_study(
    spec, workdir, *, tracking_uri, ray_address, sinks, trials=None, run_user=None, in_process=False
):
    """Two trials as Tune reports them: results in batches, a completion, an error."""
    [sink] = sinks
    fake_run_study.seen = {
        "workdir": workdir,
        "tracking_uri": tracking_uri,
        "ray": ray_address,
        "run_user": run_user,
        "in_process": in_process,
    }
    t0, t1 = _trial(0), _trial(1)
    sink.on_trial_start(0, [], t0)
    sink.on_trial_result(0, [], t0, {"history": _rows(3.0, 2.0)})
    sink.on_trial_result(0, [], t0, {"history": _rows(2.0, 1.0, start=2)})  # round 2 again
    t0.last_result = {"history": _rows(0.5, start=4), "outcome": "completed", "objective": 0.75}
    sink.on_trial_complete(0, [], t0)
    sink.on_trial_start(0, [], t1)
    sink.on_trial_error(0, [], t1)
    return SimpleNamespace(
        best={"number": 0, "value": 0.75},
        failure=None,
        experiment_id="3",
        parent_run_id="c" * 32,
        finished=2,
        counts={"trials": 2, "completed": 1, "failed": 1},
    )


def _no_trials() -> SimpleNamespace:
    """What ``run_study`` returns for a study that ran no trial (the driver's fake)."""
    return SimpleNamespace(
        best=None,
        failure=None,
        experiment_id=None,
        parent_run_id=None,
        finished=0,
        counts={"trials": 0},
    )


def test_the_driver_records_trials_and_the_final_state(ctx: ServiceContext) -> None:
    sid = running_study(ctx)
    assert run_driver(sid, ctx.settings, 1, run_study=fake_run_study) == 0
    assert fake_run_study.seen["workdir"] == study_workdir(ctx.settings, sid)
    assert fake_run_study.seen["tracking_uri"].endswith(f"studies/{sid}/mlflow.db")
    assert fake_run_study.seen["run_user"] == ANONYMOUS_ADMIN.name  # who submitted it
    assert fake_run_study.seen["in_process"] is True  # trials that fit the driver train there
    assert_fake_study_recorded(ctx, sid)


def test_trials_through_ray_keeps_every_trial_out_of_the_driver(ctx: ServiceContext) -> None:
    sid = running_study(ctx)
    settings = ctx.settings.model_copy(update={"trials_through_ray": True})
    assert run_driver(sid, settings, 1, run_study=fake_run_study) == 0
    assert fake_run_study.seen["in_process"] is False  # run_study then never places them here
    assert_fake_study_recorded(ctx, sid)


def assert_fake_study_recorded(ctx: ServiceContext, sid: str) -> None:
    """What :func:`fake_run_study` leaves in the service database, however the driver wrote."""
    with ctx.db.session(readonly=True) as s:
        repo = Repository(s)
        study = repo.require_study(sid)
        assert study.state == StudyState.SUCCEEDED and study.error is None
        assert (study.best_trial, study.best_value) == (0, 0.75)
        assert (study.mlflow_experiment_id, study.mlflow_run_id) == ("3", "c" * 32)
        trials = repo.list_trials(sid)
        assert [(t.number, t.state, t.value, t.outcome) for t in trials] == [
            (0, TrialState.COMPLETED, 0.75, "completed"),
            (1, TrialState.FAILED, None, "failed"),
        ]
        assert trials[0].params == {"hparams.client_lr": 0.1}
        curve = [(r.round, r.metrics["client_loss"]) for r in repo.curve(sid, 0)]
        assert curve == [(1, 3.0), (2, 2.0), (3, 1.0), (4, 0.5)]


@pytest.mark.parametrize("case", ["queued", "cancelled", "superseded"])
def test_a_driver_with_nothing_to_do_exits_at_once(ctx: ServiceContext, case: str) -> None:
    sid = submit_study(ctx, tiny_spec())[0].id
    with ctx.db.session() as s:
        repo = Repository(s)
        if case == "cancelled":
            repo.transition(sid, StudyState.CANCELLED)
        if case == "superseded":
            repo.transition(sid, StudyState.RUNNING, attempts=2)

    def must_not_run(*args, **kwargs):
        raise AssertionError("run_study called")

    assert run_driver(sid, ctx.settings, 1, run_study=must_not_run) == 0


def test_a_failing_study_is_marked_failed(ctx: ServiceContext) -> None:
    sid = running_study(ctx)

    def bad(*args, **kwargs):
        raise ConfigError("resources.gpu", "each trial asks for 1 GPU(s) but the cluster has 0")

    assert run_driver(sid, ctx.settings, 1, run_study=bad) == 1
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.FAILED and "resources.gpu" in study.error


def test_a_driver_error_with_a_credentialed_uri_is_stored_and_logged_without_it(
    ctx: ServiceContext, caplog
) -> None:
    from fedtune.redact import scrubbing_log_handlers

    sid = running_study(ctx)
    url = "http://u:S3cretPW@127.0.0.1:9/api/2.0/mlflow/experiments/search"

    def unreachable(*args, **kwargs):
        raise RuntimeError(f"API request to {url} failed with exception ConnectionRefused")

    scrubbing_log_handlers([caplog.handler])
    assert run_driver(sid, ctx.settings, 1, run_study=unreachable) == 1
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.FAILED
    assert "API request to http://***@127.0.0.1:9/api" in study.error
    assert "S3cretPW" not in study.error
    assert "127.0.0.1:9" in caplog.text and "S3cretPW" not in caplog.text


def test_cancelling_stops_a_running_driver(ctx: ServiceContext) -> None:
    sid = running_study(ctx)
    heartbeats = []

    def endless(spec, workdir, *, sinks, **kwargs):
        with ctx.db.session() as s:
            Repository(s).transition(sid, StudyState.CANCELLED)  # the user cancels
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with ctx.db.session(readonly=True) as s:
                heartbeats.append(Repository(s).require_study(sid).heartbeat_at)
            time.sleep(0.02)
        raise AssertionError("the driver was not stopped")

    assert run_driver(sid, ctx.settings, 1, run_study=endless) == EXIT_STOPPED
    with ctx.db.session(readonly=True) as s:
        assert Repository(s).require_study(sid).state == StudyState.CANCELLED


def test_final_states_are_synchronised_from_optuna(ctx: ServiceContext) -> None:
    sid = running_study(ctx, name="synced")
    workdir = study_workdir(ctx.settings, sid)
    workdir.mkdir(parents=True)
    storage = f"sqlite:///{workdir / 'optuna.db'}"
    study = optuna.create_study(study_name="synced", storage=storage)
    dist = {"hparams.client_lr": optuna.distributions.FloatDistribution(1e-3, 1.0, log=True)}
    for number, (state, value, outcome) in enumerate(
        [
            (optuna.trial.TrialState.COMPLETE, 0.5, "completed"),
            (optuna.trial.TrialState.FAIL, None, "interrupted"),
            (optuna.trial.TrialState.PRUNED, None, "stopped"),
        ]
    ):
        trial = optuna.trial.create_trial(
            params={"hparams.client_lr": 0.01 * (number + 1)},
            distributions=dist,
            value=value,
            state=state,
            user_attrs={"outcome": outcome},
            system_attrs={"fedtune:curve": {"rounds": [1, 2], "loss": [1.0, None]}},
        )
        study.add_trial(trial)
    with ctx.db.session() as s:  # the sink saw trial 0 start, nothing else
        Repository(s).start_trial(sid, 0, {"hparams.client_lr": 0.01})

    def quiet(*args, **kwargs):
        return SimpleNamespace(
            best=None,
            failure=None,
            experiment_id=None,
            parent_run_id=None,
            finished=2,
            counts={"trials": 2, "completed": 1, "stopped": 1},
        )

    assert run_driver(sid, ctx.settings, 1, run_study=quiet) == 0
    with ctx.db.session(readonly=True) as s:
        repo = Repository(s)
        states = [(t.number, t.state, t.value) for t in repo.list_trials(sid)]
        assert states == [
            (0, TrialState.COMPLETED, 0.5),
            (1, TrialState.KILLED, None),
            (2, TrialState.PRUNED, None),
        ]
        assert [r.metrics for r in repo.curve(sid, 2)] == [
            {"client_loss": 1.0},
            {"client_loss": None},
        ]


def test_trials_without_their_optuna_storage_are_dropped(ctx: ServiceContext) -> None:
    sid = running_study(ctx)
    with ctx.db.session() as s:
        Repository(s).finish_trial(sid, 0, TrialState.COMPLETED, 1.0, "completed")
    seen: list[int] = []

    def count(*args, **kwargs):
        with ctx.db.session(readonly=True) as s:
            seen.append(len(Repository(s).list_trials(sid)))
        return _no_trials()

    assert run_driver(sid, ctx.settings, 1, run_study=count) == 0
    assert seen == [0]
    assert not Path(study_workdir(ctx.settings, sid) / "optuna.db").exists()


def test_an_unwritable_workdir_fails_at_start_with_one_line(ctx, tmp_path, monkeypatch, capsys):
    """A driver whose FEDTUNE_WORKDIR cannot be written (a read-only root
    without a mounted workdir; here: a path below a regular file, since tests run as root)
    exits 2 at start with one line naming the variable, and the study records that line."""
    from fedtune.cli import main

    sid = running_study(ctx)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("FEDTUNE_DATABASE_URL", ctx.settings.database_url)
    monkeypatch.setenv("FEDTUNE_WORKDIR", str(blocker / "work"))
    assert main(["worker", "run-study", sid, "--attempt", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "FEDTUNE_WORKDIR" in err and str(blocker) in err
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.FAILED and study.error in err
    # a superseded attempt still refuses to start, but leaves the study alone (a new driver
    # process: its environment has the URL again, the first one dropped it before Ray)
    other = running_study(ctx)
    monkeypatch.setenv("FEDTUNE_DATABASE_URL", ctx.settings.database_url)
    assert main(["worker", "run-study", other, "--attempt", "7"]) == 2
    with ctx.db.session(readonly=True) as s:
        assert Repository(s).require_study(other).state == StudyState.RUNNING


# -- transient and permanent errors -------------------------------------------------------
_RAY_DOWN = "Ray did not start (embedded) after 3 attempt(s): TimeoutError: Timed out after 60 s"


@pytest.fixture
def dispatching(sqlite_db: Database, make_settings, fake_backend):
    """``(ctx, scheduler, backend)``: the real scheduler dispatching to a scripted backend."""
    settings = make_settings(
        database_url=sqlite_db.url, heartbeat_s=0.05, retry_backoff_s=2.0, max_dispatch_attempts=3
    )
    scheduler = Scheduler(sqlite_db, fake_backend, settings)
    return ServiceContext(sqlite_db, settings, scheduler), scheduler, fake_backend


def _drive_attempts(ctx, scheduler, backend, sid, outcomes) -> tuple[list[int], list[float]]:
    """Dispatch ``sid`` and run its driver once per outcome (an exception, or success)."""
    codes, sleeps = [], []

    def flaky(spec, workdir, **kwargs):
        outcome = outcomes[len(codes)]
        if outcome is not None:
            raise outcome
        return fake_run_study(spec, workdir, **kwargs)

    for attempt in range(1, len(outcomes) + 1):
        assert scheduler.tick().dispatched == [sid]
        assert backend.launched[-1].attempt == attempt
        codes.append(run_driver(sid, ctx.settings, attempt, run_study=flaky, sleep=sleeps.append))
        backend.finish(
            sid, attempt, DriverStatus.SUCCEEDED if codes[-1] == 0 else DriverStatus.FAILED
        )
        if codes[-1] == EXIT_REQUEUED:
            study = _study(ctx, sid)
            assert study.state == StudyState.QUEUED and study.attempts == attempt
            assert f"re-dispatching (attempt {attempt + 1} of 3)" in study.error
    return codes, sleeps


def _study(ctx: ServiceContext, sid: str):
    with ctx.db.session(readonly=True) as s:
        return Repository(s).require_study(sid)


def test_transient_errors_requeue_with_backoff_then_the_study_succeeds(dispatching) -> None:
    ctx, scheduler, backend = dispatching
    sid = submit_study(ctx, tiny_spec())[0].id
    refused = ConnectionRefusedError(111, "Connection refused")
    codes, sleeps = _drive_attempts(
        ctx, scheduler, backend, sid, [RayStartError(_RAY_DOWN), refused, None]
    )
    assert codes == [EXIT_REQUEUED, EXIT_REQUEUED, 0]
    assert sleeps == [2.0, 4.0]  # retry_backoff_s · 2^(attempt−1)
    study = _study(ctx, sid)
    assert study.state == StudyState.SUCCEEDED and study.attempts == 3 and study.error is None


def test_a_transient_error_on_the_last_attempt_fails_the_study(dispatching) -> None:
    ctx, scheduler, backend = dispatching
    sid = submit_study(ctx, tiny_spec())[0].id
    codes, sleeps = _drive_attempts(ctx, scheduler, backend, sid, [RayStartError(_RAY_DOWN)] * 3)
    assert codes == [EXIT_REQUEUED, EXIT_REQUEUED, 1] and sleeps == [2.0, 4.0]
    study = _study(ctx, sid)
    assert study.state == StudyState.FAILED and study.attempts == 3
    assert study.error.startswith("RayStartError: Ray did not start")
    assert "gave up after 3 attempts" in study.error and "\n" not in study.error
    assert scheduler.tick().dispatched == []


def _user_code_error():
    try:
        raise ConnectionResetError("the dataset server went away")
    except ConnectionResetError as exc:
        raise ConfigError("task.train_path", "cannot be read") from exc


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("resources.gpu", "each trial asks for 1 GPU(s) but the cluster has 0"),
        ZeroDivisionError("division by zero"),  # user code
    ],
)
def test_a_permanent_error_fails_the_study_at_once(dispatching, error) -> None:
    ctx, scheduler, backend = dispatching
    sid = submit_study(ctx, tiny_spec())[0].id
    codes, sleeps = _drive_attempts(ctx, scheduler, backend, sid, [error])
    assert codes == [1] and sleeps == []
    study = _study(ctx, sid)
    assert study.state == StudyState.FAILED and study.attempts == 1
    assert scheduler.tick().dispatched == []


def test_errors_are_classified_through_their_causes() -> None:
    import requests

    assert is_transient(RayStartError(_RAY_DOWN)) and is_transient(TimeoutError("read"))
    assert is_transient(requests.exceptions.ConnectionError("mlflow server down"))
    try:
        try:
            raise ConnectionRefusedError(111, "refused")
        except ConnectionRefusedError as exc:
            raise RuntimeError("MLflow logging failed") from exc
    except RuntimeError as exc:
        wrapped = exc
    assert is_transient(wrapped)
    with pytest.raises(ConfigError) as err:
        _user_code_error()
    assert not is_transient(err.value)  # a fedtune error says what to fix, whatever its cause
    assert not is_transient(ValueError("bad hyperparameter")) and not is_transient(KeyError(1))


def test_ray_not_starting_under_the_real_run_study_requeues_the_study(
    dispatching, monkeypatch
) -> None:
    """``run_study`` retries Ray start-up, then its ``RayStartError`` re-queues the study."""
    import ray

    calls = []

    def never(**kwargs):
        calls.append(kwargs)
        raise Exception("The current node timed out during startup.")  # Ray's own words

    monkeypatch.setattr(ray, "init", never)
    # a session fixture may hold a Ray of its own in this process; run_study would reuse it
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # and must not stop it
    monkeypatch.setenv("FEDTUNE_RAY_START_ATTEMPTS", "2")
    monkeypatch.setenv("FEDTUNE_RAY_START_BACKOFF_S", "0")
    ctx, scheduler, backend = dispatching
    sid = submit_study(ctx, tiny_spec())[0].id
    assert scheduler.tick().dispatched == [sid]
    sleeps = []
    through_ray = ctx.settings.model_copy(update={"trials_through_ray": True})  # else no Ray
    assert run_driver(sid, through_ray, 1, sleep=sleeps.append) == EXIT_REQUEUED
    study = _study(ctx, sid)
    assert len(calls) == 2 and sleeps == [2.0] and study.state == StudyState.QUEUED
    assert study.error.startswith("RayStartError: Ray did not start (embedded) after 2 attempt(s)")
    assert scheduler.tick().dispatched == [sid] and backend.launched[-1].attempt == 2


# ---------------------------------------------------------------- uploaded user code


DRV_LAB = {
    "drv_lab/__init__.py": b"",
    "drv_lab/tasks.py": (
        b"from fedtune.extend import register_task\n"
        b"from fedtune.trainers.tasks import build_task\n\n"
        b"@register_task('drv_quadratic', 'the quadratic task, from uploaded code')\n"
        b"def build(params, seed):\n"
        b"    return build_task('quadratic', params, seed)\n"
    ),
}


def _forget_drv_lab() -> None:
    """As in a new process: drv_lab neither imported nor on sys.path."""
    import sys

    for name in [m for m in sys.modules if m == "drv_lab" or m.startswith("drv_lab.")]:
        del sys.modules[name]
    sys.path[:] = [p for p in sys.path if "/work/code/" not in p]


def _with_code(ctx: ServiceContext, files: dict[str, bytes] = DRV_LAB) -> tuple[str, str]:
    """A running study whose spec names uploaded code (``files``), stored as the service
    stores it."""
    import io
    import zipfile

    _forget_drv_lab()
    from fedtune.code_package import sha256_of

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    package = buffer.getvalue()
    sha = sha256_of(package)
    sid = running_study(ctx)
    with ctx.db.session() as s:
        repo = Repository(s)
        spec = dict(repo.require_study(sid).spec)
        spec["task"] = {**spec["task"], "name": "drv_quadratic"}
        spec["code"] = {"modules": ["drv_lab.tasks"]}
        repo.put_code_package(sha, package)
        repo.update_study(sid, spec=spec, task="drv_quadratic", code_sha256=sha)
    return sid, sha


def test_the_driver_finds_uploaded_code_in_the_database(ctx: ServiceContext) -> None:
    """Before: the stored spec ``code: {modules}`` had no path, so the driver could not import
    the user's modules and the study failed as an invalid stored spec."""
    import shutil

    from fedtune.service.study_code import code_dir

    sid, sha = _with_code(ctx)
    seen = []

    def killed(spec, workdir, **kwargs):  # the first driver dies mid-study
        seen.append((spec.code.path, spec.task.name))
        raise KeyboardInterrupt

    def record(spec, workdir, **kwargs):
        seen.append((spec.code.path, spec.task.name))
        return _no_trials()

    assert run_driver(sid, ctx.settings, 1, run_study=killed) == EXIT_STOPPED
    where = code_dir(ctx.settings, sha)
    assert seen == [(str(where), "drv_quadratic")]
    assert (where / "drv_lab" / "tasks.py").read_bytes() == DRV_LAB["drv_lab/tasks.py"]
    # re-dispatched on a fresh machine: no extracted copy, a new process (nothing imported)
    shutil.rmtree(where)
    _forget_drv_lab()
    with ctx.db.session() as s:
        assert Repository(s).transition(sid, StudyState.QUEUED)
        assert Repository(s).transition(sid, StudyState.RUNNING, attempts=2)
    assert run_driver(sid, ctx.settings, 2, run_study=record) == 0
    assert seen[-1] == (str(where), "drv_quadratic")
    assert (where / "drv_lab" / "tasks.py").is_file()


def test_code_that_does_not_import_on_the_drivers_machine_fails_the_study_as_such(
    ctx: ServiceContext,
) -> None:
    """The service's check imported it; the driver's machine lacks a dependency (a Ray cluster
    without a package the API machine has). Before: "invalid stored spec: …"."""
    tasks = b"import drv_lab_missing_dependency\n" + DRV_LAB["drv_lab/tasks.py"]
    sid, _ = _with_code(ctx, {**DRV_LAB, "drv_lab/tasks.py": tasks})
    try:
        assert run_driver(sid, ctx.settings, 1, run_study=fake_run_study) == 1
    finally:
        _forget_drv_lab()
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.FAILED
    assert study.error.startswith(
        "the study's code failed to load on the driver's machine: code.modules[0]: "
        "importing 'drv_lab.tasks' failed: No module named 'drv_lab_missing_dependency' (at "
    ), study.error
    assert study.error.endswith("drv_lab/tasks.py:1)"), study.error


def test_uploaded_code_wins_over_an_installed_package_of_the_same_name(
    ctx: ServiceContext, tmp_path, monkeypatch
) -> None:
    """An older ``drv_lab`` importable where the driver runs (a cluster image built earlier):
    the driver still unpacks and names the study's uploaded package. Before: the installed
    copy, found importable, was used instead — the study ran code other than its digest's."""
    from fedtune.service.study_code import code_dir

    sid, sha = _with_code(ctx)
    installed = tmp_path / "site"
    (installed / "drv_lab").mkdir(parents=True)
    for name, data in DRV_LAB.items():
        (installed / name).write_bytes(data)
    monkeypatch.syspath_prepend(str(installed))
    seen = []

    def record(spec, workdir, **kwargs):
        seen.append(spec.code.path)
        return _no_trials()

    try:
        assert run_driver(sid, ctx.settings, 1, run_study=record) == 0
    finally:
        _forget_drv_lab()
    assert seen == [str(code_dir(ctx.settings, sha))]
    # inside a RayJob whose own runtime_env ships py_modules, the modules are used as stored
    sid, sha = _with_code(ctx)
    job = {"runtime_env": {"py_modules": ["http://fedtune:8000/v1/studies/x/code.zip"]}}
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps(job))
    try:
        assert run_driver(sid, ctx.settings, 1, run_study=record) == 0
    finally:
        _forget_drv_lab()
    assert seen[-1] is None


def test_a_missing_code_package_fails_the_study_naming_the_digest(ctx: ServiceContext) -> None:
    from fedtune.service.models import CodePackageRow

    sid, sha = _with_code(ctx)
    with ctx.db.session() as s:
        s.query(CodePackageRow).delete()
    assert run_driver(sid, ctx.settings, 1, run_study=fake_run_study) == 1
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.FAILED
    assert "code.sha256" in study.error and sha in study.error


def test_a_second_stop_signal_does_not_cut_the_clean_up_short(ctx: ServiceContext) -> None:
    """A cancel stops the driver twice (the backend's SIGINT, then the heartbeat's): the second
    used to raise inside the clean-up the first started, leaving in-flight trials RUNNING."""
    import os
    import signal

    sid = running_study(ctx)
    cleaned: list[str] = []

    def stopped_twice(spec, workdir, *, sinks, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the backend's stop
            time.sleep(10)
            raise AssertionError("the first SIGINT did not stop the driver")
        except KeyboardInterrupt:
            os.kill(os.getpid(), signal.SIGINT)  # the heartbeat's, during the clean-up
            for _ in range(20):  # bytecodes run: a Python signal handler has its chance
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)  # and a SIGTERM: also ignored while stopping
            time.sleep(0.05)
            cleaned.append("trials recorded as interrupted")
            raise

    assert run_driver(sid, ctx.settings, 1, run_study=stopped_twice) == EXIT_STOPPED
    assert cleaned == ["trials recorded as interrupted"]
    assert signal.getsignal(signal.SIGINT) is not None  # the previous handlers came back


def test_ray_processes_of_the_driver_do_not_inherit_the_database_url(
    ctx: ServiceContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local backend hands the driver FEDTUNE_DATABASE_URL; the embedded
    Ray it starts (raylet, agents, trial workers) inherits the driver's environment at start."""
    monkeypatch.setenv("FEDTUNE_DATABASE_URL", ctx.settings.database_url)
    seen: dict[str, str | None] = {}

    def run_study(*args, **kwargs):  # where run_study starts Ray
        seen["url"] = os.environ.get("FEDTUNE_DATABASE_URL")
        return fake_run_study(*args, **kwargs)

    sid = running_study(ctx)
    assert run_driver(sid, ctx.settings, 1, run_study=run_study) == 0
    assert seen == {"url": None}
    with ctx.db.session(readonly=True) as s:  # the driver itself still wrote the database
        assert Repository(s).require_study(sid).state == StudyState.SUCCEEDED
