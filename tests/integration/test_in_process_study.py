"""Trials in the driver's process (``run_study(..., in_process=True)``, ``fedtune tune`` without
``--ray``): a study that trains one configuration at a time on the CPU runs without Ray and
records exactly what the same study records through Ray Tune; its stops, failures and time
budget end trials as Ray Tune's do.

``ray.init`` is made to fail for the in-process runs (a session fixture's Ray may run in this
process, and ``ray.is_initialized`` is made to say it does not): a study that reached Ray would
fail loudly.

The in-process studies after the first share one MLflow store process (``tracking_process``,
as a study of methods' studies share theirs: MLflow imported once, not once a study); the
first starts its own, as a lone study does.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from mlflow import MlflowClient
from ray import tune

from fedtune.tuning.driver.in_process import in_process_note
from fedtune.tuning.driver.study import run_study
from fedtune.tuning.keys import TRIAL_KEY
from fedtune.tuning.spec import StudySpec
from tests.shared_tracking import shared_tracking


def _spec(quadratic_study, name: str, **overrides: Any) -> StudySpec:
    doc = quadratic_study(name, **{"budget": {"trials": 4, "max_concurrent": 1}, **overrides})
    return StudySpec.from_dict(doc)


@pytest.fixture(scope="module")
def tracking_process() -> Iterator[dict[str, Any]]:
    """``run_study``'s arguments for one MLflow store process that the module's in-process
    studies after the first share (:func:`tests.shared_tracking.shared_tracking`)."""
    with shared_tracking() as shared:
        yield shared


def _here(spec: StudySpec, workdir: Path, shared: dict[str, Any], **kwargs: Any):
    """``run_study`` of ``spec`` with its trials in this process.

    Args:
        spec: The study.
        workdir: Its directory.
        shared: The shared MLflow store process's arguments (:func:`tracking_process`).
        **kwargs: More arguments of ``run_study``.

    Returns:
        The study's result.
    """
    return run_study(spec, workdir, in_process=True, **shared, **kwargs)


@contextlib.contextmanager
def _without_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    import ray

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("ray.init was called by a study whose trials run in its driver")

    with monkeypatch.context() as m:
        m.setattr(ray, "is_initialized", lambda: False)
        m.setattr(ray, "init", refuse)
        yield


class _Where(tune.Callback):
    """The process of each configuration's results, and the rounds each reported."""

    def __init__(self) -> None:
        self.pids: dict[int, set[int]] = {}
        self.rounds: dict[int, list[int]] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        number = int(trial.config[TRIAL_KEY])
        self.pids.setdefault(number, set()).add(int(result["pid"]))
        self.rounds.setdefault(number, []).extend(int(r["round"]) for r in result["history"])


def _records(result) -> dict[int, dict[str, Any]]:
    """Per trial: Optuna's state, params, value, intermediate values and attributes, and its
    MLflow run's status, params, outcome and ``client_loss`` history (every round)."""
    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    client = MlflowClient(result.tracking_uri)
    out = {}
    for t in study.get_trials():
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        history = client.get_metric_history(run.info.run_id, "client_loss")
        attrs = {k: v for k, v in t.user_attrs.items() if k not in ("mlflow_run_id",)}
        out[t.number] = {
            "state": t.state.name,
            "params": t.params,
            "value": t.value,
            "intermediate": t.intermediate_values,
            "attrs": attrs,
            "status": run.info.status,
            "run_params": {k: v for k, v in run.data.params.items()},
            "outcome": run.data.tags.get("outcome"),
            "client_loss": sorted((m.step, m.value) for m in history),
        }
    return out


def test_it_records_what_ray_tune_records(tmp_path, ray_local, quadratic_study, monkeypatch):
    spec = _spec(quadratic_study, "here-vs-ray", scheduler={"name": "none"})
    where = _Where()
    with _without_ray(monkeypatch):
        here = run_study(spec, tmp_path / "here", in_process=True, sinks=[where])
    ray_tune = run_study(spec, tmp_path / "ray", in_process=True)  # Ray runs: Ray Tune's path
    assert here.packing == in_process_note(1) and ray_tune.packing != in_process_note(1)
    assert not (tmp_path / "here" / "ray_results").exists()
    assert (tmp_path / "ray" / "ray_results").is_dir()
    assert set(where.pids) == {0, 1, 2, 3} and all(p == {os.getpid()} for p in where.pids.values())
    assert all(r == list(range(1, 13)) for r in where.rounds.values())  # every round, once
    assert here.finished == ray_tune.finished == 4 and here.counts == ray_tune.counts
    assert here.best == ray_tune.best and here.best is not None
    assert here.configuration_rounds == ray_tune.configuration_rounds == 4 * 12
    mine, theirs = _records(here), _records(ray_tune)
    # Optuna's intermediate values are a sample in time (at most one a second per trial, and
    # the last): where both hold a round, the value is the same, and both hold the last
    for number, r in mine.items():
        a, b = r.pop("intermediate"), theirs[number].pop("intermediate")
        assert a[12] == b[12] and all(a[k] == b[k] for k in a.keys() & b.keys())
    assert mine == theirs  # every trial: Optuna's and MLflow's records, value for value
    assert all(r["state"] == "COMPLETE" and r["status"] == "FINISHED" for r in mine.values())
    assert all(len(r["client_loss"]) == 12 for r in mine.values())
    assert here.tradeoff == ray_tune.tradeoff and here.tradeoff is not None  # tradeoff.json


def test_a_pack_of_every_configuration_records_what_ray_tune_records(
    tmp_path, ray_local, quadratic_study, monkeypatch, tracking_process
):
    # 4 configurations at a time in one pack, 8 in all: members stopped by ASHA and refilled
    spec = _spec(
        quadratic_study,
        "here-packed",
        budget={"trials": 8, "max_concurrent": 4},
        resources={"cpu": 1, "gpu": 0, "pack": 4},
        scheduler={"name": "asha", "grace_rounds": 2, "reduction_factor": 2},
    )
    where = _Where()
    with _without_ray(monkeypatch):
        here = _here(spec, tmp_path / "here", tracking_process, sinks=[where])
    ray_tune = run_study(spec, tmp_path / "ray", in_process=False)
    assert here.packing == in_process_note(4) and "4 configurations per trial process" in str(
        ray_tune.packing
    )
    assert all(p == {os.getpid()} for p in where.pids.values()) and len(where.pids) == 8
    mine, theirs = _records(here), _records(ray_tune)
    for number, r in mine.items():
        a, b = r.pop("intermediate"), theirs[number].pop("intermediate")
        assert all(a[k] == b[k] for k in a.keys() & b.keys())
    assert mine == theirs  # stops and refills at the same reports: the same records
    assert here.stop_reasons == ray_tune.stop_reasons and here.stop_reasons
    assert here.best == ray_tune.best and here.tradeoff == ray_tune.tradeoff


def test_a_stopped_trial_ends_at_the_report_that_stopped_it(
    tmp_path, quadratic_study, monkeypatch, tracking_process
):
    spec = _spec(
        quadratic_study,
        "here-stops",
        budget={"trials": 8, "max_concurrent": 1},
        scheduler={"name": "asha", "grace_rounds": 2, "reduction_factor": 2},
        search={
            "space": "fedavg",
            "override": {
                "client_lr": {"low": 1.0e-4, "high": 0.1},
                "server_lr": {"low": 1.0e-3, "high": 0.2},
            },
        },
    )
    where = _Where()
    with _without_ray(monkeypatch):
        result = _here(spec, tmp_path / "w", tracking_process, sinks=[where])
    records = _records(result)
    stopped = {n for n, r in records.items() if r["attrs"].get("outcome") == "stopped"}
    assert stopped and result.stop_reasons  # the study stopped some of its trials
    assert sum(result.stop_reasons.values()) == len(stopped)
    for number, r in records.items():
        reported = where.rounds[number]
        assert reported == list(range(1, len(reported) + 1))  # never a round past the stop
        assert [s for s, _ in r["client_loss"]] == reported  # MLflow holds every round reported
        if number in stopped:
            assert len(reported) < 12 and r["outcome"] == "stopped"
        else:
            assert len(reported) == 12 and r["state"] == "COMPLETE"
    assert result.configuration_rounds == sum(len(r) for r in where.rounds.values())


def test_a_failed_trial_is_recorded_and_the_study_goes_on(
    tmp_path, quadratic_study, monkeypatch, tracking_process
):
    from fedtune.tuning.packing.runs import Single

    spec = _spec(quadratic_study, "here-fails", scheduler={"name": "none"})
    step = Single.step

    def failing(self):
        if self.number == 1 and self.trainers[0].round == 2:
            raise ValueError("boom in round 3")
        return step(self)

    monkeypatch.setattr(Single, "step", failing)
    with _without_ray(monkeypatch):
        result = _here(spec, tmp_path / "w", tracking_process)
    records = _records(result)
    assert result.counts["failed"] == 1 and result.finished == 4
    assert result.first_error == "trial 1: ValueError: boom in round 3"
    assert records[1]["status"] == "FAILED" and records[1]["outcome"] == "failed"
    client = MlflowClient(result.tracking_uri)
    run = client.get_run(
        optuna.load_study(study_name=result.name, storage=result.storage_url)
        .trials[1]
        .user_attrs["mlflow_run_id"]
    )
    assert run.data.tags["error"] == "ValueError: boom in round 3"
    assert [s for s, _ in records[1]["client_loss"]] == [1, 2]  # the rounds it reported
    assert all(records[n]["state"] == "COMPLETE" for n in (0, 2, 3))


def test_a_callback_error_ends_the_study_not_the_trial(
    tmp_path, quadratic_study, monkeypatch, tracking_process
):
    class Broken(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
            raise RuntimeError("the sink is down")

    spec = _spec(quadratic_study, "here-sink", scheduler={"name": "none"})
    with _without_ray(monkeypatch), pytest.raises(RuntimeError, match="the sink is down"):
        _here(spec, tmp_path / "w", tracking_process, sinks=[Broken()])
    storage = f"sqlite:///{tmp_path / 'w' / 'optuna.db'}"
    trials = optuna.load_study(study_name=spec.name, storage=storage).trials
    # the trial in flight is re-run by the next invocation, as after Ray Tune's fit raised
    assert trials[0].user_attrs["outcome"] == "interrupted" and len(trials) == 2
    assert trials[1].user_attrs["requeue_of"] == 0


def test_the_time_budget_leaves_the_trial_in_flight_to_the_next_run(
    tmp_path, quadratic_study, monkeypatch, tracking_process
):
    slow = {"rounds": 200_000, "clients_per_round": 5, "local_steps": 3, "batch_size": 4}
    spec = _spec(
        quadratic_study,
        "here-time",
        scheduler={"name": "none"},
        train={**slow, "eval_every": 1000, "dtype": "float64"},
        budget={"trials": 4, "max_concurrent": 1, "time": 2},
        report_every=50,
    )
    with _without_ray(monkeypatch):
        result = _here(spec, tmp_path / "w", tracking_process)
    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    first = study.trials[0]
    assert result.finished == 0 and first.user_attrs["outcome"] == "interrupted"
    assert [t.user_attrs.get("requeue_of") for t in study.trials[1:]] == [0]  # runs again next
    run = MlflowClient(result.tracking_uri).get_run(first.user_attrs["mlflow_run_id"])
    assert run.info.status == "KILLED"


def test_fedtune_tune_runs_it_without_ray_and_with_ray_when_asked(tmp_path, quadratic_study):
    doc = quadratic_study("cli-here", budget={"trials": 2, "max_concurrent": 1})
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["FEDTUNE_TIMELINE"] = str(tmp_path / "timeline.jsonl")
    out = {}
    for flag, workdir in (([], "here"), (["--ray"], "ray")):
        cmd = [sys.executable, "-m", "fedtune.cli", "tune", str(study), "--json"]
        cmd += ["--workdir", str(tmp_path / workdir), *flag]
        run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        out[workdir] = json.loads(run.stdout)
    assert out["here"]["packing"] == in_process_note(1) != out["ray"]["packing"]
    assert out["here"]["best"] == out["ray"]["best"] and out["here"]["finished"] == 2
    phases = [json.loads(line)["phase"] for line in (tmp_path / "timeline.jsonl").open()]
    first = phases[: phases.index("finalized") + 1]
    assert "in_process" in first and not any("ray" in p for p in first)  # no Ray, not even early
    assert "early_ray" in phases[len(first) :]  # --ray: Ray as before
