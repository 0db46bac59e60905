"""A study submitted through the service lands in its project's MLflow workspace.

A real ``fedtune serve`` (local backend: the driver is a child process with embedded Ray) with
``FEDTUNE_MLFLOW_WORKSPACES`` on, against a real ``mlflow server --enable-workspaces --app-name
basic-auth``. The project's workspace is made with the project; the driver logs with its
workspace's credential; the other project's member neither finds nor lists the study's runs.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from fedtune.client import Client
from fedtune.service.mlflow_tenancy import MlflowTenancy
from fedtune.service.states import StudyState
from tests.integration.conftest import stop_group
from tests.integration.test_mlflow_tenancy import ADMIN_PASSWORD, start_server
from tests.service.helpers import Server, tiny_spec

pytestmark = pytest.mark.slow
TOKEN = "tenancy-e2e-token-0123456789abcdef"


def test_a_submitted_study_logs_into_its_projects_workspace(tmp_path: Path) -> None:
    root = tmp_path / "mlflow"
    root.mkdir()
    proc, url = start_server(root)
    server = None
    try:
        env = {
            "FEDTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'fedtune.db'}",
            "FEDTUNE_WORKDIR": str(tmp_path / "work"),
            "FEDTUNE_BACKEND": "local",
            "FEDTUNE_API_TOKEN": TOKEN,
            "FEDTUNE_MAX_CONCURRENT_STUDIES": "1",
            "FEDTUNE_SCHEDULER_INTERVAL_S": "0.2",
            "FEDTUNE_HEARTBEAT_S": "1",
            "MLFLOW_TRACKING_URI": url,
            "FEDTUNE_MLFLOW_WORKSPACES": "true",
            "FEDTUNE_MLFLOW_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "MLFLOW_TRACKING_USERNAME": "admin",
            "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD,
        }
        server = Server(env, tmp_path / "serve.log").start()
        headers = {"Authorization": f"Bearer {TOKEN}"}
        for project in ("team-a", "team-b"):
            made = httpx.post(
                f"{server.url}/v1/projects", json={"name": project}, headers=headers, timeout=60
            )
            assert made.status_code == 201, made.text
        with Client(server.url, token=TOKEN, timeout=60) as sdk:
            study = sdk.submit(tiny_spec(name="tenant", trials=2, rounds=3, project="team-a"))
            deadline = time.monotonic() + 240
            while not (status := study.status()).done:
                assert time.monotonic() < deadline, status
                time.sleep(0.5)
        assert status.state == StudyState.SUCCEEDED, status.error
        run_id = status.mlflow.run_id
        with httpx.Client(base_url=url, auth=("admin", ADMIN_PASSWORD), timeout=30) as admin:
            run = admin.get(
                "/api/2.0/mlflow/runs/get",
                params={"run_id": run_id},
                headers={"X-MLFLOW-WORKSPACE": "team-a"},
            )
            assert run.status_code == 200, run.text
            experiment_id = run.json()["run"]["info"]["experiment_id"]
            experiment = admin.get(
                "/api/2.0/mlflow/experiments/get",
                params={"experiment_id": experiment_id},
                headers={"X-MLFLOW-WORKSPACE": "team-a"},
            ).json()["experiment"]
            assert experiment["workspace"] == "team-a"
        # the member of team-b: no such run, and nothing of it listed
        tenancy = MlflowTenancy(url, "admin", ADMIN_PASSWORD)
        tenancy.sync(["team-a", "team-b"], {"bob": {"team-b": "member"}})
        password = tenancy.issue_password("bob")
        tenancy.close()
        for workspace in ("team-a", "team-b"):
            with httpx.Client(
                base_url=url,
                auth=("bob", password),
                headers={"X-MLFLOW-WORKSPACE": workspace},
                timeout=30,
            ) as bob:
                got = bob.get("/api/2.0/mlflow/runs/get", params={"run_id": run_id})
                assert got.status_code in (403, 404)
                found = bob.post(
                    "/api/2.0/mlflow/runs/search", json={"experiment_ids": [experiment_id]}
                )
                assert run_id not in found.text
    finally:
        if server is not None:
            server.stop()
        stop_group(proc)
