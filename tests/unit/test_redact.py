"""Issue 20 req. 2 / issue 24 item 6: no credential of a URI reaches MLflow or an answer."""

from __future__ import annotations

from pathlib import Path

import yaml

from fedtune.redact import scrub, strip_credentials
from fedtune.service.redact import redact_uri
from fedtune.tuning.spec import StudySpec
from fedtune.tuning.tracking import StudyTracker

SECRET_URI = "https://alice:s3cret@mlflow.example.com:5000/prefix?token=t0k"


def test_uris_lose_their_credentials_and_local_stores_their_paths() -> None:
    assert strip_credentials(SECRET_URI) == "https://mlflow.example.com:5000/prefix"
    assert strip_credentials("sqlite:////srv/x/mlflow.db") == "sqlite:////srv/x/mlflow.db"
    assert strip_credentials("not a uri") == "not a uri"
    assert scrub({"a": [SECRET_URI, 1], "b": {"c": SECRET_URI}}) == {
        "a": ["https://mlflow.example.com:5000/prefix", 1],
        "b": {"c": "https://mlflow.example.com:5000/prefix"}}  # fmt: skip
    assert redact_uri(SECRET_URI) == "https://mlflow.example.com:5000/prefix"
    assert redact_uri("postgresql://u:p@db:5432/mlflow") == "postgresql://db:5432/mlflow"
    assert redact_uri("sqlite:////srv/fedtune/work/abc/mlflow.db") is None  # the server's disk
    assert redact_uri(None) is None


def test_a_spec_tracking_uri_with_credentials_never_reaches_mlflow(tmp_path) -> None:
    spec = StudySpec.from_dict({
        "name": "s", "task": {"name": "quadratic", "clients": 4, "dim": 2},
        "algorithm": "fedavg", "train": {"rounds": 30}, "tracking": {"uri": SECRET_URI},
    })  # fmt: skip
    tracker = StudyTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp")
    run_id = tracker.start_study(spec, {}, None)
    run = tracker.client.get_run(run_id)
    assert run.data.params["tracking.uri"] == "https://mlflow.example.com:5000/prefix"
    assert not any("s3cret" in v for v in run.data.params.values())
    path = tracker.client.download_artifacts(run_id, "spec.yaml", str(tmp_path))
    text = Path(path).read_text()
    assert "s3cret" not in text and "t0k" not in text
    assert yaml.safe_load(text)["tracking"]["uri"] == "https://mlflow.example.com:5000/prefix"
