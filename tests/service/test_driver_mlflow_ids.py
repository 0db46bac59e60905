"""The study's MLflow parent run and its experiment, as the service's driver reports them when
its first trial starts: read from the Optuna storage, where the study records them as a pair,
so that a driver whose trials run in its process never imports MLflow; a parent recorded
without its experiment (by an older driver) is looked up in the MLflow store."""

from __future__ import annotations

import pytest
from optuna.study import StudyDirection

import fedtune.tuning.mlflow.client as mlflow_client
from fedtune.service.driver import _MlflowIds
from fedtune.service.optuna_sync import OptunaView
from fedtune.tuning.optuna.store import PARENT_ATTR, StudyStore

OLD, NEW = "a" * 32, "b" * 32


class _Link:
    def __init__(self) -> None:
        self.ids: list[tuple[str, str | None]] = []

    def set_mlflow_ids(self, run_id: str, experiment_id: str | None) -> None:
        self.ids.append((run_id, experiment_id))


def _store(tmp_path) -> StudyStore:
    store = StudyStore.at(tmp_path, "s")
    store.storage.create_new_study([StudyDirection.MINIMIZE], "s")
    store.storage.create_new_trial(store.study_id)  # trial 0
    return store


def test_the_parent_run_and_its_experiment_are_kept_as_a_pair(tmp_path) -> None:
    store = _store(tmp_path)
    assert store.parent_run() == (None, None)
    store.set_parent_run_id(OLD)
    assert store.parent_run() == (OLD, None)
    store.set_parent_run_id(NEW, "7")
    assert store.parent_run() == (NEW, "7") and store.parent_run_id() == NEW
    store.storage.set_study_user_attr(store.study_id, PARENT_ATTR, OLD)  # recorded alone
    assert store.parent_run() == (OLD, None)  # the experiment of another run is not its


def test_the_driver_reports_the_recorded_experiment_without_mlflow(tmp_path, monkeypatch) -> None:
    _store(tmp_path).set_parent_run_id(NEW, "7")
    monkeypatch.setattr(
        mlflow_client, "run_experiment_id", lambda *a: pytest.fail("looked up in MLflow")
    )
    link = _Link()
    ids = _MlflowIds(link, OptunaView(tmp_path, "s"), "sqlite:///unused.db")
    assert ids.trial_run(0) is None and ids.trial_run(0) is None
    assert link.ids == [(NEW, "7")]  # once


def test_a_parent_recorded_alone_has_its_experiment_looked_up(tmp_path, monkeypatch) -> None:
    _store(tmp_path).set_parent_run_id(OLD)
    asked = []
    monkeypatch.setattr(
        mlflow_client, "run_experiment_id", lambda uri, run: asked.append((uri, run)) or "9"
    )
    link = _Link()
    _MlflowIds(link, OptunaView(tmp_path, "s"), "sqlite:///m.db").trial_run(0)
    assert link.ids == [(OLD, "9")] and asked == [("sqlite:///m.db", OLD)]
