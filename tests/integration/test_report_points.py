"""Optuna is written once per *report point*, not once per round, and at most once per trial
every ``FedtuneSearch.REPORT_INTERVAL_S`` (a write costs the driver ~4 ms):
the last round's value is always written (a pruned trial's value), MLflow keeps every round."""

from __future__ import annotations

import optuna
import pytest
from mlflow import MlflowClient

from fedtune.tuning import StudySpec, run_study
from fedtune.tuning.optuna.searcher import FedtuneSearch


def _study(tmp_path, quadratic_study, name: str, **overrides):
    spec = StudySpec.from_dict(
        quadratic_study(name, budget={"trials": 3, "max_concurrent": 2}, **overrides)
    )
    uri = f"sqlite:///{tmp_path / name / 'mlflow.db'}"
    result = run_study(spec, tmp_path / name, tracking_uri=uri)
    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    trials = [t for t in study.trials if t.state.is_finished()]
    assert len(trials) == 3
    return trials, MlflowClient(uri)


def _check_against_mlflow(t, client: MlflowClient) -> None:
    reached = t.user_attrs["rounds"]
    run = t.user_attrs["mlflow_run_id"]
    objective = {m.step: m.value for m in client.get_metric_history(run, "objective")}
    assert sorted(objective) == list(range(1, reached + 1))  # MLflow: every round
    assert {s: objective[s] for s in t.intermediate_values} == pytest.approx(
        t.intermediate_values, rel=1e-12
    )
    assert t.value == t.intermediate_values[reached]  # completed and pruned alike
    assert len(t.system_attrs["fedtune:curve"]["rounds"]) == reached


def test_intermediate_values_only_at_report_points(
    tmp_path, ray_local, quadratic_study, monkeypatch
) -> None:
    monkeypatch.setattr(FedtuneSearch, "REPORT_INTERVAL_S", 0.0)
    trials, client = _study(tmp_path, quadratic_study, "points", report_every=3)
    for t in trials:
        reached = t.user_attrs["rounds"]
        points = sorted({*range(3, reached + 1, 3), reached})  # every 3rd round and the last
        assert sorted(t.intermediate_values) == points  # the old code: every round 1..reached
        _check_against_mlflow(t, client)


def test_at_most_one_write_per_interval_and_always_the_last(
    tmp_path, ray_local, quadratic_study, monkeypatch
) -> None:
    monkeypatch.setattr(FedtuneSearch, "REPORT_INTERVAL_S", 3600.0)
    trials, client = _study(tmp_path, quadratic_study, "sparse")
    for t in trials:
        reached = t.user_attrs["rounds"]
        assert sorted(t.intermediate_values) == sorted({1, reached})  # first report, last round
        _check_against_mlflow(t, client)
