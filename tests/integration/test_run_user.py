"""MLflow's "Created by": the tracker names a study's user (the service passes its owner) on
every run it creates, the parent and each trial's child, in the driver's process or in the
tracker's own process; with no user it records none, as before."""

from __future__ import annotations

from mlflow import MlflowClient

from fedtune.tuning.mlflow.process import TrackerProcess
from fedtune.tuning.mlflow.tracking import StudyTracker
from fedtune.tuning.spec import StudySpec


def _runs(tracker, spec: StudySpec) -> tuple[str, str]:
    parent = tracker.start_study(spec, {"parameters": []}, None)
    child = tracker.start_trial(parent, 0, {"hparams.client_lr": 0.1}, {"study": spec.name})
    tracker.end_trial(child, "FINISHED", {"outcome": "completed"}, {"objective": 0.5}, step=1)
    tracker.finish_study(parent, {"n_trials": 1.0}, "FINISHED", step=1)
    return parent, child


def _users(uri: str, *run_ids: str) -> list[tuple[str | None, str]]:
    client = MlflowClient(uri)
    runs = [client.get_run(r) for r in run_ids]
    return [(r.data.tags.get("mlflow.user"), r.info.user_id) for r in runs]


def test_every_run_names_the_user_in_this_process(tmp_path, quadratic_study) -> None:
    spec = StudySpec.from_dict(quadratic_study("created-by"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    artifacts = (tmp_path / "artifacts").as_uri()  # not ./mlruns
    runs = _runs(StudyTracker(uri, "exp", artifacts, user="alice"), spec)
    assert _users(uri, *runs) == [("alice", "alice")] * 2
    anonymous = _runs(StudyTracker(uri, "exp-2", artifacts), spec)
    assert [tag for tag, _ in _users(uri, *anonymous)] == [None, None]


def test_every_run_names_the_user_in_the_trackers_process(tmp_path, quadratic_study) -> None:
    spec = StudySpec.from_dict(quadratic_study("created-by-child"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    process = TrackerProcess()
    try:
        runs = _runs(process.open(uri, "exp", (tmp_path / "artifacts").as_uri(), user="bob"), spec)
    finally:
        process.close()
    assert _users(uri, *runs) == [("bob", "bob")] * 2
