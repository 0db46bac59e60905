"""End to end: real Ray trials that all raise end the study ``failed``.

A study is submitted to the service and run by the real driver with the real ``run_study``:
every trial's sampled task value is out of the task's range and its build raises. The study
used to end ``succeeded`` with ``error: null``; now it ends ``failed``, its reason naming the
number of failed trials and the first trial's error, which the Optuna storage also keeps.
"""

from __future__ import annotations

import optuna

from fedtune.service.db import Database
from fedtune.service.driver import run_driver
from fedtune.service.migrate import upgrade_database
from fedtune.service.paths import study_workdir
from fedtune.service.repository import Repository
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.settings import load_settings
from fedtune.service.states import StudyState, TrialState
from fedtune.tuning.driver.failures import FIRST_ERROR_ATTR
from fedtune.tuning.optuna import search as og


def _run_by_the_service(tmp_path, spec: dict, **settings: object) -> tuple:
    """Submit ``spec`` to a service on SQLite, run its driver (attempt 1, which must exit 1),
    and return ``(settings, study, trials)`` as the database keeps them."""
    settings = load_settings(
        database_url=f"sqlite:///{tmp_path / 'fedtune.db'}",
        workdir=str(tmp_path / "work"),
        backend="none",
        heartbeat_s=1.0,
        **settings,
    )
    db = Database(settings.database_url)
    upgrade_database(db)
    try:
        sid = submit_study(ServiceContext(db, settings), spec)[0].id
        with db.session() as s:
            Repository(s).transition(sid, StudyState.RUNNING, attempts=1)
        assert run_driver(sid, settings, 1) == 1
        with db.session(readonly=True) as s:
            repo = Repository(s)
            return settings, repo.require_study(sid), repo.list_trials(sid)
    finally:
        db.dispose()


def test_a_study_whose_trials_all_raise_ends_failed_with_the_first_error(
    tmp_path, ray_local, quadratic_study
):
    # the base configuration builds (the driver's preflight passes); every sampled
    # task.heterogeneity is out of the task's range, so each trial's task build raises
    spec = quadratic_study(
        "all-fail",
        sampler={"name": "random", "seed": 0},
        scheduler={"name": "none"},
        search={"parameters": {"task.heterogeneity": {"type": "float", "low": 2.0, "high": 3.0}}},
    )
    spec["budget"] = {"trials": 2, "max_concurrent": 1}
    settings, study, trials = _run_by_the_service(tmp_path, spec)
    assert study.state == StudyState.FAILED, study.error
    assert study.error.startswith("all 2 trials failed; trial 0: "), study.error
    assert "task.heterogeneity" in study.error and "TrialError" not in study.error
    assert [t.state for t in trials] == [TrialState.FAILED, TrialState.FAILED]
    storage = og.storage_url(study_workdir(settings, study.id))
    kept = optuna.load_study(study_name="all-fail", storage=storage).user_attrs
    assert kept[FIRST_ERROR_ATTR]["trial"] == 0


def test_a_data_file_that_cannot_be_read_fails_the_study_before_any_trial(tmp_path):
    """In the service: the driver's preflight reads the task's file once;
    the study ends ``failed`` with the loader's error naming the file, and no trial runs (this
    study's trials used to start on Ray and each fail the same way)."""
    data = tmp_path / "data"
    data.mkdir()
    bad = data / "train.h5"
    bad.write_text("not an HDF5 file\n")
    spec = {
        "name": "unreadable",
        "task": {"name": "emnist", "train_path": str(bad), "max_clients": 4},
        "algorithm": "fedavg",
        "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 1, "batch_size": 2},
        "objective": {"last_rounds": 1},
        "scheduler": {"name": "none"},
        "sampler": {"name": "random", "seed": 0},
        "budget": {"trials": 2, "max_concurrent": 1},
    }
    _, study, trials = _run_by_the_service(tmp_path, spec, data_roots=str(data))
    assert study.state == StudyState.FAILED, study.error
    assert str(bad) in study.error and "cannot open as HDF5" in study.error, study.error
    assert trials == []


def test_a_study_whose_trials_all_diverge_fails_the_same_way_in_the_cli_and_the_service(
    tmp_path, ray_local, quadratic_study, capsys
):
    """No finite best value → ``failed`` with the reason, one rule for the
    CLI (exit 1, the reason printed) and the service (state ``failed``, ``error`` = reason;
    it used to end ``succeeded`` with ``best: -``); each trial's outcome is ``diverged``."""
    import json
    from types import SimpleNamespace

    import yaml

    from fedtune.cli import main
    from fedtune.cli.tune import _best_lines

    raw = quadratic_study(
        "all-diverge",
        sampler={"name": "grid"},
        scheduler={"name": "none"},
        search={"parameters": {"server_lr": {"type": "categorical", "choices": [2.0, 3.0]}}},
        hparams={"client_lr": 0.05},
    )
    raw["budget"] = {"trials": 2, "max_concurrent": 1}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["tune", str(path), "--workdir", str(tmp_path / "cli"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["best"] is None and "client loss" in out["failure"]
    assert out["failure"].startswith("all 2 trials diverged; trial 0: ")
    assert _best_lines(SimpleNamespace(**out), None) == [f"no best configuration: {out['failure']}"]

    _, study, trials = _run_by_the_service(tmp_path, raw)
    assert study.state == StudyState.FAILED
    assert study.error.startswith("all 2 trials diverged; trial 0: "), study.error
    assert "client loss" in study.error and study.best_value is None
    assert [t.outcome for t in trials] == ["diverged", "diverged"]


_RAISING_TASK = """
from fedtune.extend import register_task


@register_task("pf_broken")
def build(params, seed):
    raise OSError("the data share is not mounted")
"""


def test_a_task_that_cannot_be_built_stops_the_study_before_any_trial(tmp_path, quadratic_study):
    """The driver builds the task once, before any trial runs; its error is
    one line naming the field and the user's file:line, and ``fedtune tune`` exits 2 (it used
    to start Ray, run every trial into the same error and exit 1 after a minute)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    import yaml

    pkg = tmp_path / "lab" / "pf_lab"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "tasks.py").write_text(_RAISING_TASK)
    raw = quadratic_study("preflight", scheduler={"name": "none"})
    raw["task"] = {"name": "pf_broken"}
    raw["code"] = {"path": "./lab", "modules": ["pf_lab.tasks"]}
    raw["budget"] = {"trials": 4, "max_concurrent": 2}
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(raw))
    bin_dir = Path(sys.executable).parent
    t0 = time.monotonic()
    run = subprocess.run(
        [str(bin_dir / "fedtune"), "tune", "study.yaml", "--workdir", "w"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - t0
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-3000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("fedtune: error:")]
    assert len(errors) == 1, run.stderr[-3000:]
    assert "task.name" in errors[0] and "OSError: the data share is not mounted" in errors[0]
    assert f"{pkg / 'tasks.py'}:7" in errors[0]
    assert "Traceback" not in run.stderr
    storage = tmp_path / "w" / "optuna.db"
    if storage.exists():  # the study's stores may exist; no trial was ever asked for
        study = optuna.load_study(study_name="preflight", storage=f"sqlite:///{storage}")
        assert study.trials == []
    print(f"refused after {took:.1f} s")
