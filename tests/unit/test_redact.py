"""No credential of a URI reaches MLflow or an answer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from fedtune.redact import scrub, scrub_text, strip_credentials
from fedtune.service.redact import redact_uri
from fedtune.tuning.mlflow.tracking import StudyTracker
from fedtune.tuning.spec import StudySpec

SECRET_URI = "https://alice:s3cret@mlflow.example.com:5000/prefix?token=t0k"


def test_uris_lose_their_credentials_and_local_stores_their_paths() -> None:
    assert strip_credentials(SECRET_URI) == "https://mlflow.example.com:5000/prefix"
    assert strip_credentials("sqlite:////srv/x/mlflow.db") == "sqlite:////srv/x/mlflow.db"
    assert strip_credentials("not a uri") == "not a uri"
    assert scrub({"a": [SECRET_URI, 1], "b": {"c": SECRET_URI}}) == {
        "a": ["https://mlflow.example.com:5000/prefix", 1],
        "b": {"c": "https://mlflow.example.com:5000/prefix"},
    }
    assert redact_uri(SECRET_URI) == "https://mlflow.example.com:5000/prefix"
    assert redact_uri("postgresql://u:p@db:5432/mlflow") == "postgresql://db:5432/mlflow"
    assert redact_uri("sqlite:////srv/fedtune/work/abc/mlflow.db") is None  # the server's disk
    assert redact_uri(None) is None


def test_a_spec_tracking_uri_with_credentials_never_reaches_mlflow(tmp_path) -> None:
    spec = StudySpec.from_dict(
        {
            "name": "s",
            "task": {"name": "quadratic", "clients": 4, "dim": 2},
            "algorithm": "fedavg",
            "train": {"rounds": 30},
            "tracking": {"uri": SECRET_URI},
        }
    )
    tracker = StudyTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "exp")
    run_id = tracker.start_study(spec, {}, None)
    run = tracker.client.get_run(run_id)
    assert run.data.params["tracking.uri"] == "https://mlflow.example.com:5000/prefix"
    assert not any("s3cret" in v for v in run.data.params.values())
    path = tracker.client.download_artifacts(run_id, "spec.yaml", str(tmp_path))
    text = Path(path).read_text()
    assert "s3cret" not in text and "t0k" not in text
    assert yaml.safe_load(text)["tracking"]["uri"] == "https://mlflow.example.com:5000/prefix"


def test_free_text_loses_the_credentials_of_every_uri_in_it() -> None:
    error = (
        "API request to http://u:S3cretPW@127.0.0.1:9/api/2.0/mlflow/experiments/search "
        "failed with exception HTTPConnectionPool(host='127.0.0.1', port=9)"
    )
    assert scrub_text(error) == error.replace("u:S3cretPW@", "***@")
    assert scrub_text("see https://alice@mlflow:5000/x") == "see https://***@mlflow:5000/x"
    two = "from postgresql+psycopg://db:pw1@db:5432/m to 'https://a:pw2@mlflow/x?token=t'"
    scrubbed = "from postgresql+psycopg://***@db:5432/m to 'https://***@mlflow/x?token=***'"
    assert scrub_text(two) == scrubbed
    for plain in ("write to a@b.com", "http://mlflow:5000/x?u=a@b", "git@github.com:o/r", ""):
        assert scrub_text(plain) == plain


def test_a_tune_that_cannot_reach_its_tracking_server_hides_the_password(tmp_path) -> None:
    spec = {
        "name": "unreachable",
        "task": {"name": "quadratic", "clients": 4, "dim": 2},
        "algorithm": "fedavg",
        "train": {"rounds": 2},
        "budget": {"trials": 1},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env |= {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "fedtune.cli",
            "tune",
            str(tmp_path / "s.yaml"),
            "--workdir",
            str(tmp_path / "w"),
            "--tracking-uri",
            f"http://u:S3cretPW@127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode != 0
    assert f"127.0.0.1:{port}" in run.stderr  # the error is there, without the password
    assert "S3cretPW" not in run.stderr + run.stdout
