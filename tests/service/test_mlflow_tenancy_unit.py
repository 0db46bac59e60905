"""MLflow workspaces without a server: names, derived driver credentials, what each backend hands
its driver, and what the settings refuse (the real server is tests/integration's)."""

from __future__ import annotations

import pytest

from fedtune.errors import ConfigError
from fedtune.service.backends.base import LaunchRequest
from fedtune.service.backends.k8s_manifest import rayjob_manifest
from fedtune.service.backends.local import LocalBackend
from fedtune.service.mlflow_workspaces import (
    driver_env,
    driver_env_for,
    driver_password,
    driver_user,
    workspace_for,
)

ADMIN = "unit-admin-password-0123456789"
SERVER = "http://mlflow.example:5000"


def test_a_project_is_a_workspace_of_the_same_name_where_mlflow_accepts_it():
    assert workspace_for(None) == workspace_for("default") == "default"
    assert workspace_for("team-a") == "team-a"
    assert workspace_for("a") == "project-a"  # MLflow wants two characters at least
    assert workspace_for("api") == "project-api"  # reserved by MLflow


def test_driver_credentials_derive_from_the_admin_password_per_workspace():
    a, b = driver_password(ADMIN, "team-a"), driver_password(ADMIN, "team-b")
    assert a != b and a == driver_password(ADMIN, "team-a") and len(a) == 64
    assert ADMIN not in a and driver_password("another-admin-password", "team-a") != a
    env = driver_env(ADMIN, "team-a")
    assert env == {
        "MLFLOW_WORKSPACE": "team-a",
        "MLFLOW_TRACKING_USERNAME": driver_user("team-a"),
        "MLFLOW_TRACKING_PASSWORD": a,
    }


def test_settings_need_a_server_and_a_password_for_workspaces(make_settings):
    assert driver_env_for(make_settings(), "team-a") == {}  # laptop mode: nothing changes
    with pytest.raises(ConfigError, match="http"):
        make_settings(mlflow_workspaces=True, mlflow_admin_password=ADMIN)
    with pytest.raises(ConfigError, match="FEDTUNE_MLFLOW_ADMIN_PASSWORD"):
        make_settings(mlflow_workspaces=True, mlflow_tracking_uri=SERVER)
    with pytest.raises(ConfigError, match="placeholder"):
        make_settings(
            mlflow_workspaces=True, mlflow_tracking_uri=SERVER, mlflow_admin_password="changeme"
        )


def test_local_and_kubernetes_drivers_get_their_workspace_never_the_admin(
    make_settings, monkeypatch
):
    settings = make_settings(
        backend="local",
        mlflow_workspaces=True,
        mlflow_tracking_uri=SERVER,
        mlflow_admin_password=ADMIN,
    )
    for name in ("FEDTUNE_MLFLOW_ADMIN_PASSWORD", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(name, ADMIN)  # the service's own environment
    monkeypatch.setenv("FEDTUNE_MLFLOW_WORKSPACES", "true")
    env = LocalBackend(settings)._env("team-a")
    assert env["MLFLOW_WORKSPACE"] == "team-a"
    assert env["MLFLOW_TRACKING_PASSWORD"] == driver_password(ADMIN, "team-a")
    assert ADMIN not in env.values() and "FEDTUNE_MLFLOW_ADMIN_PASSWORD" not in env
    assert "FEDTUNE_MLFLOW_WORKSPACES" not in env

    k8s = make_settings(
        backend="kubernetes",
        k8s_env_secret="demo-fedtune-env",
        mlflow_workspaces=True,
        mlflow_tracking_uri=SERVER,
        mlflow_admin_password=ADMIN,
    )
    request = LaunchRequest("0123456789ab", 1, project="team-b")
    manifest = rayjob_manifest(request, k8s)
    head = manifest["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    values = {e["name"]: e.get("value") for e in head["containers"][0]["env"]}
    assert values["MLFLOW_WORKSPACE"] == "team-b"
    assert values["MLFLOW_TRACKING_USERNAME"] == driver_user("team-b")
    assert ADMIN not in str(manifest)
    for group in manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        assert "MLFLOW_TRACKING_PASSWORD" not in str(group)


def test_an_mlflow_answer_shown_by_readyz_names_no_project_or_user():
    """``/readyz`` is open: a failed sync's reason keeps MLflow's words, not the names in them."""
    from fedtune.service.mlflow_sync import scrub

    line = (
        "MLflow POST /api/2.0/mlflow/users/create answered 400: User "
        "'fedtune-driver-vision' exists; vision, ana-b and ana"
    )
    names = {"vision", "fedtune-driver-vision", "ana", "ana-b", "x", ""}
    assert scrub(line, names) == (
        "MLflow POST /api/2.0/mlflow/users/create answered 400: User '…' exists; …, … and …"
    )


def test_a_launch_in_a_made_workspace_does_not_wait_for_a_sync_in_progress(monkeypatch):
    """A sync that waits on MLflow holds the loop's lock: a study of a project whose workspace
    is made already is launched at once, one of a new project waits for the sync."""
    import threading

    from fedtune.service import mlflow_sync
    from fedtune.service.mlflow_sync import TenancyLoop

    made: list[str | None] = []
    monkeypatch.setattr(mlflow_sync, "record_workspaces", lambda db, projects: len(projects))

    class Tenancy:
        def ensure_workspace(self, project):
            made.append(project)

    loop = TenancyLoop(None, Tenancy(), period_s=60)
    loop._ready.add("default")
    request = LaunchRequest(study_id="0123456789ab", attempt=1, project="default")
    with loop._lock:  # a sync in progress
        launch = threading.Thread(target=loop.before_launch, args=(request,), daemon=True)
        launch.start()
        launch.join(5)
        assert not launch.is_alive()  # returned: the workspace was made
        waiting = threading.Thread(target=loop.ensure, args=("team-b",), daemon=True)
        waiting.start()
        waiting.join(0.2)
        assert waiting.is_alive() and made == []  # a new workspace waits for the sync
    waiting.join(5)
    assert not waiting.is_alive() and made == ["team-b"]
