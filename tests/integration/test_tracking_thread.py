"""The MLflow store opens in a thread while Tune sets up and the first trial's worker starts:
every trial still gets its child run, and a store that cannot open is the
study's error, not a hang or a study without runs."""

from __future__ import annotations

import threading
import time

import pytest
from mlflow import MlflowClient

from fedtune.tuning import StudySpec, run_study
from fedtune.tuning.driver import study as study_module


def test_a_slow_tracking_store_delays_no_trial_and_loses_no_run(
    tmp_path, ray_local, quadratic_study, monkeypatch
) -> None:
    real = study_module._open_tracking
    opened: list[str] = []

    def slow(stores, plan, *rest):
        time.sleep(3.0)  # MLflow's import and store on a loaded machine
        opened.append(threading.current_thread().name)
        return real(stores, plan, *rest)

    monkeypatch.setattr(study_module, "_open_tracking", slow)
    spec = StudySpec.from_dict(quadratic_study("slow", budget={"trials": 3, "max_concurrent": 1}))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    result = run_study(spec, tmp_path / "w", tracking_uri=uri)
    assert opened and opened[0].startswith("fedtune-stores")
    assert result.finished == 3
    client = MlflowClient(uri)
    runs = client.search_runs(
        [result.experiment_id], f"tags.`mlflow.parentRunId` = '{result.parent_run_id}'"
    )
    assert sorted(int(r.data.tags["optuna_trial_number"]) for r in runs) == [0, 1, 2]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert client.get_run(result.parent_run_id).info.status == "FINISHED"


def test_a_tracking_store_that_cannot_open_is_the_studys_error(
    tmp_path, ray_local, quadratic_study
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    spec = StudySpec.from_dict(quadratic_study("broken", budget={"trials": 2, "max_concurrent": 1}))
    with pytest.raises(OSError) as caught:
        run_study(spec, tmp_path / "w", tracking_uri=f"sqlite:///{blocker / 'mlflow.db'}")
    assert isinstance(caught.value, OSError) and str(blocker) in str(caught.value)
