"""Through the service: a study's MLflow links never carry the
tracking URI's credentials, and a local store's path is not shown at all."""

from __future__ import annotations

from fedtune.service.repository import Repository
from fedtune.service.services import ServiceContext, get_study, submit_study

from .helpers import tiny_spec


def _links(sqlite_db, make_settings, tracking_uri: str) -> dict:
    ctx = ServiceContext(
        sqlite_db, make_settings(database_url=sqlite_db.url, mlflow_tracking_uri=tracking_uri)
    )
    sid = submit_study(ctx, tiny_spec(name="links"))[0].id
    with sqlite_db.session() as s:
        Repository(s).update_study(sid, mlflow_experiment_id="7", mlflow_run_id="abc123")
    return get_study(ctx, sid).to_json()


def test_a_tracking_uri_with_credentials_is_shown_without_them(sqlite_db, make_settings) -> None:
    study = _links(sqlite_db, make_settings, "https://alice:s3cret@mlflow.example:5000/base?t=k")
    assert study["mlflow"]["tracking_uri"] == "https://mlflow.example:5000/base"
    assert study["mlflow"]["run_url"].startswith(
        "https://mlflow.example:5000/base/#/experiments/7/runs/abc123?"
    )
    assert "s3cret" not in str(study) and "alice" not in str(study["mlflow"])


def test_a_local_store_is_not_shown(sqlite_db, make_settings, tmp_path) -> None:
    study = _links(sqlite_db, make_settings, f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert study["mlflow"]["tracking_uri"] is None and study["mlflow"]["run_url"] is None
    assert str(tmp_path) not in str(study["mlflow"])
