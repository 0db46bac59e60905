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


def test_links_open_the_run_where_members_open_mlflow_in_its_workspace(
    sqlite_db, make_settings
) -> None:
    """The service logs to an in-cluster address; members open the published one, and with
    workspaces every link names the project's (MLflow's "Select workspace" page otherwise)."""
    settings = make_settings(
        database_url=sqlite_db.url,
        mlflow_tracking_uri="http://demo-mlflow.ml.svc:5000",
        mlflow_public_url="https://mlflow.example.com/",
        mlflow_workspaces=True,
        mlflow_admin_password="admin-password-0123456789",
    )
    ctx = ServiceContext(sqlite_db, settings)
    sid = submit_study(ctx, tiny_spec(name="links"))[0].id
    before = get_study(ctx, sid).to_json()["mlflow"]
    assert before["run_url"] is None  # not started: the UI, on the workspace
    assert before["ui_url"] == "https://mlflow.example.com/#/experiments?workspace=default"
    assert before["workspace"] == "default"
    assert before["login"] == "/v1/users/{user}/mlflow-login"
    with sqlite_db.session() as s:
        Repository(s).update_study(sid, mlflow_experiment_id="7", mlflow_run_id="abc123")
    links = get_study(ctx, sid).to_json()["mlflow"]
    assert links["run_url"] == (
        "https://mlflow.example.com/#/experiments/7/runs/abc123"
        "?workflowType=machine_learning&workspace=default"
    )
    assert links["tracking_uri"] == "http://demo-mlflow.ml.svc:5000"


def test_without_workspaces_links_name_none(sqlite_db, make_settings) -> None:
    study = _links(sqlite_db, make_settings, "http://mlflow.example:5000")
    links = study["mlflow"]
    assert links["workspace"] is None and links["login"] is None
    assert "workspace=" not in links["run_url"] and "workspace=" not in links["ui_url"]
