"""The MLflow store in a process of its own (``fedtune.tuning.mlflow.process``): the driver's
calls reach a real ``StudyTracker`` in the child and their records are in the store, a second
study's in its own store through the same child; an error in the child is raised in the
driver; Ctrl-C does not end the child, closing does; and a study whose trials run in its
driver never imports MLflow there, and turns Python's cyclic collector back on (paused by
``fedtune tune`` for its start) when its tuner begins."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from mlflow import MlflowClient

from fedtune.tuning.mlflow.process import TrackerProcess
from fedtune.tuning.mlflow.record import study_record
from fedtune.tuning.spec import StudySpec


def test_calls_reach_the_tracker_and_errors_come_back(tmp_path, quadratic_study) -> None:
    spec = StudySpec.from_dict(quadratic_study("in-a-process"))
    uri, other = (f"sqlite:///{tmp_path / name}" for name in ("mlflow.db", "next.db"))
    process = TrackerProcess()
    try:
        tracker = process.open(uri, "exp", (tmp_path / "artifacts").as_uri())
        assert tracker.uri == uri and tracker.experiment_id
        parent = tracker.start_study(spec, {"parameters": []}, None)
        run_id = tracker.start_trial(parent, 0, {"hparams.client_lr": 0.1}, {"study": spec.name})
        tracker.log_rounds(run_id, [{"round": r, "client_loss": 1.0 / r} for r in (1, 2, 3)])
        tracker.end_trial(run_id, "FINISHED", {"outcome": "completed"}, {"objective": 0.5}, step=3)
        assert tracker.unsent() == 0
        os.kill(process._process.pid, signal.SIGINT)  # Ctrl-C reaches the process group
        time.sleep(0.5)
        assert process._process.is_alive()  # the driver's clean-up still needs the store
        tracker.finish_study(parent, {"n_trials": 1.0}, "FINISHED", step=1)
        with pytest.raises(Exception, match=r"not found|RESOURCE_DOES_NOT_EXIST"):
            tracker.end_trial("0" * 32, "FINISHED", {})
        with pytest.raises(AttributeError):
            tracker.client  # noqa: B018 — only the tracker's served methods reach the child
        # the next study (a study of methods' next algorithm) opens its own store in the same
        # process; what it queued is stored when the process closes
        second = process.open(other, "exp2", None)
        assert second.uri == other
        next_parent = second.start_study(spec, {"parameters": []}, None)
        next_run = second.start_trial(next_parent, 0, {"hparams.client_lr": 0.2}, {})
        second.log_rounds(next_run, [{"round": r, "client_loss": 2.0 / r} for r in (1, 2)])
    finally:
        process.close()
    assert not process._process.is_alive()
    process.close()  # again: nothing
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["outcome"] == "completed"
    assert [m.step for m in client.get_metric_history(run_id, "client_loss")] == [1, 2, 3]
    parent_run = client.get_run(parent)
    assert parent_run.info.status == "FINISHED" and parent_run.data.tags["study"] == spec.name
    assert parent_run.data.params["search.space"] == study_record(spec).space  # made in the driver
    assert parent_run.data.params["algorithm"] == "fedavg"
    assert not client.search_runs(  # the second study's runs are in its own store only
        [e.experiment_id for e in client.search_experiments()], "params.hparams.client_lr = '0.2'"
    )
    history = MlflowClient(other).get_metric_history(next_run, "client_loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.0)]


def test_a_call_after_the_child_died_says_so(tmp_path) -> None:
    process = TrackerProcess()
    try:
        process._process.kill()
        process._process.join(30)
        with pytest.raises(RuntimeError, match="MLflow process ended"):
            process.open(f"sqlite:///{tmp_path / 'm.db'}", "exp", None)
    finally:
        process.close()


_DRIVER = textwrap.dedent(
    """
    import gc, json, sys
    from fedtune.tuning.common import start_gc, timeline

    start_gc.pause()  # as fedtune tune does before the driver's imports
    collector = {}  # whether the collector was on at each phase's first mark
    mark = timeline.mark
    timeline.mark = lambda phase, t=None: (collector.setdefault(phase, gc.isenabled()), mark(phase, t))
    from fedtune.tuning.driver.study import run_study
    from fedtune.tuning.spec import StudySpec

    spec = StudySpec.from_dict(json.loads(sys.argv[1]))
    result = run_study(spec, sys.argv[2], in_process=True)
    print(json.dumps({"finished": result.finished, "packing": result.packing,
                      "mlflow_here": "mlflow" in sys.modules, "ray_up": __import__("ray").is_initialized(),
                      "collector": collector, "frozen": gc.get_freeze_count()}))
    """
)


def test_a_study_in_its_driver_never_imports_mlflow_there(tmp_path, quadratic_study) -> None:
    doc = quadratic_study("no-mlflow-here", budget={"trials": 2, "max_concurrent": 1})
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.run(
        [sys.executable, "-c", _DRIVER, json.dumps(doc), str(tmp_path / "w")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["finished"] == 2 and not out["mlflow_here"] and not out["ray_up"]
    # the start (the driver's imports, the stores) without the cyclic collector, the trials
    # with it, the start's objects frozen (fedtune.tuning.common.start_gc)
    collector = out["collector"]
    assert not collector["optuna_opened"] and not collector["fit"], collector
    assert collector["first_trial_scheduled"] and collector["finalized"], collector
    assert out["frozen"] > 100_000
    client = MlflowClient(f"sqlite:///{tmp_path / 'w' / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 3  # the parent and one run per trial, stored by the child
