"""Resume: ``kill -9`` of a ``fedtune tune`` driver mid-study, re-run, then ``--trials`` extends.

The driver runs as a subprocess with its own embedded Ray and logs to the real ``mlflow server``.
Once the Optuna storage holds a finished trial *and* a running one, the driver is stopped
(SIGSTOP, so that the running trial cannot finish before the kill), the storage is read again,
and the driver gets SIGKILL (no cleanup code runs); the same command is run again and must
finish the study with exactly the budgeted number of trials, re-running the interrupted points,
leaving the trials finished before the kill untouched and creating no second finished MLflow
run for any trial.

The killed driver's Ray agents and trial workers outlive it (about a minute, idle or still
computing). They are frozen with SIGSTOP right after the kill — as hung processes would be,
so that none can end on its own — and the next run must stop them and remove
the study's ``/tmp/fedtune-ray-*`` temp dir at its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from fedtune.tuning.driver.ray_runtime import _start_ticks as _ticks  # live (not zombie) start time
from fedtune.tuning.driver.ray_runtime import ray_temp_dir
from tests.integration.conftest import make_quadratic_study
from tests.lean_script import command as lean_command
from tests.procs import wait_not_dying

REPO = Path(__file__).resolve().parents[2]
N = 3
_STUDY = make_quadratic_study(
    "resume-quad",
    train={
        "rounds": 80,
        "clients_per_round": 5,
        "local_steps": 3,
        "batch_size": 4,
        "eval_every": 10,
        "dtype": "float64",
    },
    search={
        "space": "fedavg",
        "override": {
            "client_lr": {"low": 0.02, "high": 0.1},
            "server_lr": {"low": 0.05, "high": 0.15},
        },
    },
    objective={"metric": "train_loss", "last_rounds": 10},
    sampler={"name": "random", "seed": 1},
    scheduler={"name": "none"},
    budget={"trials": N, "max_concurrent": 2},
    resources={"pack": 1},  # two Ray trial processes (pack auto would weigh them by cost)
    report_every=5,
)


def _states(db: Path) -> dict[str, int]:
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5) as con:
            rows = con.execute("select state, count(*) from trials group by state").fetchall()
    except sqlite3.Error:
        return {}
    return dict(rows)


def _mid_study(db: Path) -> bool:
    """Whether the storage holds a finished trial and a running one."""
    states = _states(db)
    return states.get("COMPLETE", 0) >= 1 and states.get("RUNNING", 0) >= 1


def _snapshot(study: optuna.Study) -> dict[int, tuple]:
    return {
        t.number: (t.state, t.values, t.params, t.datetime_complete, t.intermediate_values)
        for t in study.trials
        if t.state.is_finished() and t.user_attrs.get("outcome") != "interrupted"
    }


def _tune(spec: Path, workdir: Path, uri: str, *extra: str) -> list[str]:
    # the driver's Ray is a lean one (``tests/lean_script.py``): it takes no worker logs
    # (``log_to_driver=False``) and nothing autoscales it, so no log or autoscaler monitor
    return lean_command(
        str(Path(sys.executable).parent / "fedtune"),
        "tune",
        str(spec),
        "--workdir",
        str(workdir),
        "--tracking-uri",
        uri,
        *extra,
    )


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, mlflow_server, proc_tools):
    root = tmp_path_factory.mktemp("resume")
    spec, workdir = root / "study.yaml", root / "w"
    spec.write_text(yaml.safe_dump(_STUDY))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}  # tests.lean_script
    env.pop("MLFLOW_TRACKING_URI", None)
    with (root / "first.log").open("w") as log:
        driver = subprocess.Popen(
            _tune(spec, workdir, mlflow_server), stdout=log, stderr=subprocess.STDOUT, env=env
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and driver.poll() is None:
            if _mid_study(workdir / "optuna.db"):
                # The driver is the storage's only writer: stopped, it cannot finish the
                # running trial between this look and the kill (a race a slow machine lost).
                driver.send_signal(signal.SIGSTOP)
                if _mid_study(workdir / "optuna.db"):
                    break
                driver.send_signal(signal.SIGCONT)
            time.sleep(0.3)
        assert driver.poll() is None, (root / "first.log").read_text()
        assert _mid_study(workdir / "optuna.db"), _states(workdir / "optuna.db")
        storage = f"sqlite:///{workdir / 'optuna.db'}"
        before = _snapshot(optuna.load_study(study_name=_STUDY["name"], storage=storage))
        children = proc_tools.descendants(driver.pid)
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
        # Ray's own children of the driver (GCS, raylet) die of its death (PR_SET_PDEATHSIG:
        # SIGKILL), theirs of theirs: only the processes that outlive it are to be frozen
        dying = wait_not_dying(children, 60)
        assert not dying, f"the killed driver's processes {dying} still dying after 60 s"
        orphans = _freeze(children)
        temp = ray_temp_dir(workdir.resolve())
        leftovers = {"orphans": sorted(orphans), "temp_dir_after_kill": temp.is_dir()}
        second = subprocess.run(
            _tune(spec, workdir, mlflow_server),
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        leftovers["alive_after_rerun"] = sorted(p for p, t in orphans.items() if _ticks(p) == t)
    finally:
        if driver.poll() is None:
            driver.kill()
        if "orphans" in locals():  # only the processes we froze, if still the same
            for pid, ticks in orphans.items():
                if _ticks(pid) == ticks:
                    os.kill(pid, signal.SIGKILL)
        else:
            proc_tools.kill_pids(children if "children" in locals() else [])
    assert second.returncode == 0, second.stderr[-3000:]
    return {
        "spec": spec,
        "workdir": workdir,
        "storage": storage,
        "before": before,
        "env": env,
        "second": second,
        "temp": temp,
        **leftovers,
    }


def _freeze(pids: list[int]) -> dict[int, int]:
    """SIGSTOP those of ``pids`` still alive; returns them with their start times."""
    frozen = {}
    for pid in pids:
        ticks = _ticks(pid)
        if ticks is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                frozen[pid] = ticks
    return frozen


def test_the_next_run_reaps_a_killed_drivers_ray_processes(killed_and_resumed):
    ctx = killed_and_resumed
    assert ctx["orphans"], "no Ray process outlived the killed driver"
    assert ctx["temp"].parent == Path("/tmp") and ctx["temp"].name.startswith("fedtune-ray-")
    assert ctx["temp_dir_after_kill"]  # what a SIGKILL leaves behind ...
    assert ctx["alive_after_rerun"] == []  # ... the next run stopped
    assert not ctx["temp"].exists()  # ... and removed at its end


def _children(uri: str, name: str) -> tuple[object, list]:
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    parents = client.search_runs([experiment.experiment_id], f"attributes.run_name = '{name}'")
    assert len(parents) == 1  # the resumed driver reused the study's parent run
    parent = parents[0]
    runs = client.search_runs(
        [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    return parent, runs


def test_resume_after_kill_9(killed_and_resumed, mlflow_server):
    ctx = killed_and_resumed
    study = optuna.load_study(study_name=_STUDY["name"], storage=ctx["storage"])
    assert ctx["before"], "no trial had finished before the kill"
    interrupted = [t for t in study.trials if t.user_attrs.get("outcome") == "interrupted"]
    counted = [t for t in study.trials if t.state.is_finished() and t not in interrupted]
    assert len(interrupted) >= 1 and all(t.state.name == "FAIL" for t in interrupted)
    assert len(counted) == N  # exactly the budget: nothing lost, nothing repeated
    assert not [t for t in study.trials if not t.state.is_finished()]
    # the interrupted points were re-run (same parameters), each exactly once
    for t in interrupted:
        reruns = [r for r in counted if r.user_attrs.get("requeue_of") == t.number]
        assert len(reruns) == 1 and reruns[0].params == t.params
    # trials finished before the kill are untouched
    after = _snapshot(study)
    assert {n: after[n] for n in ctx["before"]} == ctx["before"]
    assert "re-ran interrupted trials" in ctx["second"].stdout
    parent, runs = _children(mlflow_server, _STUDY["name"])
    assert parent.info.status == "FINISHED"
    finished = [
        int(r.data.tags["optuna_trial_number"]) for r in runs if r.info.status == "FINISHED"
    ]
    assert sorted(finished) == sorted(t.number for t in counted)  # one finished run per trial
    killed = {int(r.data.tags["optuna_trial_number"]) for r in runs if r.info.status == "KILLED"}
    assert killed <= {t.number for t in interrupted}
    assert not [r for r in runs if r.info.status == "RUNNING"]


def test_trials_option_extends_a_finished_study(killed_and_resumed, mlflow_server):
    ctx = killed_and_resumed
    before = _snapshot(optuna.load_study(study_name=_STUDY["name"], storage=ctx["storage"]))
    # one more trial: one trial process is all an extension needs (each costs ~3 CPU-s)
    cmd = _tune(ctx["spec"], ctx["workdir"], mlflow_server, "--trials", str(N + 1), "--json")
    run = subprocess.run(cmd, capture_output=True, text=True, env=ctx["env"], timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert (result["finished"], result["ran"], result["target_trials"]) == (N + 1, 1, N + 1)
    after = _snapshot(optuna.load_study(study_name=_STUDY["name"], storage=ctx["storage"]))
    assert len(after) == N + 1
    assert {n: after[n] for n in before} == before
    parent, runs = _children(mlflow_server, _STUDY["name"])
    assert parent.info.run_id == result["parent_run_id"]
    finished = [
        int(r.data.tags["optuna_trial_number"]) for r in runs if r.info.status == "FINISHED"
    ]
    assert sorted(finished) == sorted(after)
