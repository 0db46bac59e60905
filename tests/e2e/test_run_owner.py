"""Who did what, through a real service: a member's study names the member as the user of its
MLflow runs (MLflow's "Created by"), the parent run and each trial's child run, and ``fedtune
studies`` lists the member as its owner. The owner reaches the driver with the study's claim
(``driver_ops.Claim``), not through the driver's environment.

A real ``fedtune serve`` (local backend, its driver a child process with embedded Ray) with
``FEDTUNE_MLFLOW_WORKSPACES``, against a real ``fedtune mlflow-server``; alice is a member of
project ``vision`` made through the API. The page ``docs/how-to/mlflow-projects.md`` shows the
API calls of a member's MLflow login and a call of MLflow's REST API: its blocks for such a
service run here, as alice.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import httpx
import pytest

from fedtune.client import Client
from fedtune.service.states import StudyState
from tests.docs.pages import parse_page
from tests.integration.conftest import BIN, stop_group
from tests.integration.test_mlflow_tenancy import ADMIN_PASSWORD, start_server
from tests.service.helpers import REPO, Server, tiny_spec

pytestmark = pytest.mark.slow
TOKEN = "run-owner-e2e-token-0123456789abcdef"
PAGE = REPO / "docs" / "how-to" / "mlflow-projects.md"
NEEDS = "Needs a service with MLflow workspaces"


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory):
    """``(service, MLflow URL, alice's token)``: both servers up, project ``vision``, alice;
    shared by the module's tests, in the file's order: the first runs alice's study (the only
    study, which it counts), the second only logs alice in to MLflow and lists its users."""
    tmp_path = tmp_path_factory.mktemp("team")
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
        with Client(server.url, token=TOKEN, timeout=60) as admin:
            admin.create_project("vision")
            alice = admin.create_user("alice", project="vision").token
        yield server, url, alice
    finally:
        if server is not None:
            server.stop()
        stop_group(proc)


def test_a_members_study_names_the_member_in_mlflow_and_in_the_listing(team, tmp_path) -> None:
    server, url, alice = team
    with Client(server.url, token=alice, timeout=60) as sdk:
        study = sdk.submit(tiny_spec(name="alices", trials=2, rounds=3, project="vision"))
        deadline = time.monotonic() + 300
        while not (status := study.status()).done:
            assert time.monotonic() < deadline, status
            time.sleep(0.2)
        assert status.state == StudyState.SUCCEEDED, status.error
        assert [s.owner for s in sdk.studies()] == ["alice"]
    listed = subprocess.run(
        [str(BIN / "fedtune"), "studies"],
        env={**os.environ, "FEDTUNE_URL": server.url, "FEDTUNE_TOKEN": alice},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()
    assert header.split()[3] == "owner" and row.split()[1:4] == ["succeeded", "vision", "alice"]
    parent = status.mlflow.run_id
    with httpx.Client(
        base_url=url,
        auth=("admin", ADMIN_PASSWORD),
        headers={"X-MLFLOW-WORKSPACE": "vision"},
        timeout=30,
    ) as admin:
        run = admin.get("/api/2.0/mlflow/runs/get", params={"run_id": parent}).json()["run"]
        children = admin.post(
            "/api/2.0/mlflow/runs/search",
            json={
                "experiment_ids": [run["info"]["experiment_id"]],
                "filter": f"tags.mlflow.parentRunId = '{parent}'",
            },
        ).json()["runs"]
    assert len(children) == 2
    for each in [run, *children]:
        tags = {t["key"]: t["value"] for t in each["data"]["tags"]}
        assert tags["mlflow.user"] == "alice", tags
        assert each["info"]["user_id"] == "alice"


def test_the_pages_member_calls_run_as_written(team, tmp_path) -> None:
    server, url, alice = team
    blocks = [b for b in parse_page(PAGE).blocks if b.lang == "bash" and b.title == NEEDS]
    assert len(blocks) == 2, "the page's login and users/list blocks"
    script = "set -euo pipefail\n" + "\n".join("\n".join(b.lines) for b in blocks)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "FEDTUNE_URL": server.url,
        "FEDTUNE_TOKEN": alice,
        "MLFLOW_URL": url,
    }
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    workspaces, listed = done.stdout.strip().splitlines()
    assert workspaces == "['vision']"
    users = {u["username"] for u in json.loads(listed)["users"]}
    assert "alice" in users and "admin" not in users  # the workspace's users, not the server's
    # the header is what makes it work: without it MLflow answers for `default`
    password = json.loads((tmp_path / "login.json").read_text())["password"]
    bare = httpx.get(f"{url}/api/2.0/mlflow/users/list", auth=("alice", password), timeout=30)
    assert bare.status_code == 403, bare.text
