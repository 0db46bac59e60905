"""MLflow for a team's browsers: ``fedtune mlflow-server --public-url`` against a real server.

One ``fedtune mlflow-server --host 0.0.0.0 --public-url http://box.test:PORT --allowed-hosts
box:5000`` for the module (workspaces and basic auth, as the chart runs it). Requests reach it
on loopback carrying the Host and Origin headers a browser on another machine sends for that
name (the harness that leaves loopback for real is the network-namespace one): MLflow accepts
the public name with its port and its origin for the UI's ``POST /ajax-api/...``, still accepts
loopback (the service's own connection and its sync), and refuses any other name or origin.
A service whose MLflow refuses its Host header says so in ``/readyz``, with MLflow's answer.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import BIN, stop_group, wait_http
from tests.ports import free_port

pytestmark = pytest.mark.integration

ADMIN_PASSWORD = "public-url-admin-password-0123456789"
INVALID_HOST = "Invalid Host header - possible DNS rebinding attack detected"
CORS_BLOCKED = "Cross-origin request blocked"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[dict]:
    """The server (one retry on a failed start): its port, loopback URL and log."""
    for attempt in (1, 2):
        root = tmp_path_factory.mktemp(f"mlflow-public-{attempt}")
        port = free_port()
        env = {**os.environ, "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD}
        for name in ("MLFLOW_TRACKING_URI", "MLFLOW_WORKSPACE", "MLFLOW_BACKEND_STORE_URI"):
            env.pop(name, None)
        cmd = [
            str(BIN / "fedtune"),
            "mlflow-server",
            f"--dir={root / 'mlflow'}",
            "--host=0.0.0.0",
            f"--port={port}",
            f"--public-url=http://box.test:{port}",
            "--allowed-hosts=box:5000",
        ]
        log = root / "server.log"
        with log.open("w") as fh:
            proc = subprocess.Popen(
                cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_http(f"{url}/health", proc, timeout=150, log=log)
            break
        except (RuntimeError, TimeoutError):
            stop_group(proc)
            if attempt == 2:
                raise
    try:
        yield {"port": port, "url": url, "log": log}
    finally:
        stop_group(proc)


def _get(server: dict, host: str) -> httpx.Response:
    """An admin's API read sent to loopback with ``host`` as its Host header."""
    return httpx.get(
        f"{server['url']}/api/3.0/mlflow/workspaces",
        headers={"Host": host},
        auth=("admin", ADMIN_PASSWORD),
        timeout=30,
    )


def _search_runs(server: dict, origin: str) -> httpx.Response:
    """The UI's runs list request (``POST /ajax-api/2.0/mlflow/runs/search``) from ``origin``,
    as a browser that opened the public URL sends it."""
    port = server["port"]
    return httpx.post(
        f"{server['url']}/ajax-api/2.0/mlflow/runs/search",
        headers={"Host": f"box.test:{port}", "Origin": origin},
        json={"experiment_ids": ["0"], "max_results": 10},
        auth=("admin", ADMIN_PASSWORD),
        timeout=30,
    )


def test_the_banner_lists_the_public_url_and_loopback(server):
    port = server["port"]
    lines = Path(server["log"]).read_text().splitlines()
    assert lines[0].startswith(
        f"MLflow at http://box.test:{port} and http://127.0.0.1:{port} (this machine), "
    )
    assert lines[2] == (
        f"  MLFLOW_TRACKING_URI=http://127.0.0.1:{port} FEDTUNE_MLFLOW_WORKSPACES=true \\"
    )
    assert lines[3] == f"  FEDTUNE_MLFLOW_PUBLIC_URL=http://box.test:{port} \\"


def test_the_public_name_with_its_port_and_loopback_are_accepted_other_names_refused(server):
    port = server["port"]
    for host in (f"box.test:{port}", "box:5000", f"127.0.0.1:{port}", f"localhost:{port}"):
        answer = _get(server, host)
        assert answer.status_code == 200, (host, answer.text)
        assert "workspaces" in answer.json()
    for host in (f"evil.test:{port}", "box.test", "box.test:1", f"box:{port}"):
        answer = _get(server, host)
        assert (answer.status_code, answer.text) == (403, INVALID_HOST), host


def test_the_ui_may_post_from_the_public_origin_and_no_other(server):
    port = server["port"]
    mine = _search_runs(server, f"http://box.test:{port}")
    assert mine.status_code == 200, mine.text
    assert mine.text != CORS_BLOCKED
    local = _search_runs(server, f"http://127.0.0.1:{port}")  # loopback's origin, as before
    assert local.status_code == 200, local.text
    for origin in (f"http://evil.test:{port}", f"https://box.test:{port}", "http://box:5000"):
        refused = _search_runs(server, origin)  # --allowed-hosts adds Host headers, no origin
        assert (refused.status_code, refused.text) == (403, CORS_BLOCKED), origin


def _app(settings):
    from fastapi.testclient import TestClient

    from fedtune.service.api.app import create_app

    return TestClient(create_app(settings, backend=None, schedule=True))


def _mlflow_state(client, timeout: float = 120.0) -> dict:
    """``/readyz`` once the tuning stack is warm and the first MLflow sync has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = client.get("/readyz")
        if answer.status_code == 200 and answer.json()["mlflow"]["up"] is not None:
            return answer.json()
        time.sleep(0.5)
    raise TimeoutError(f"/readyz: {answer.status_code} {answer.text}")


def test_readyz_says_when_mlflow_refuses_the_services_host_and_when_it_syncs(server, tmp_path):
    """The service reaching MLflow by a name MLflow was not given (here 127.0.0.2, which is
    loopback but not on MLflow's list) is degraded, with MLflow's answer; on 127.0.0.1 its
    sync works and it is ready."""
    from fedtune.service.settings import load_settings

    port = server["port"]

    def settings(uri: str, name: str):
        return load_settings(
            database_url=f"sqlite:///{tmp_path / name}.db",
            api_token="public-url-bootstrap-token-0123456789",
            workdir=str(tmp_path / name),
            mlflow_workspaces=True,
            mlflow_tracking_uri=uri,
            mlflow_admin_password=ADMIN_PASSWORD,
        )

    with _app(settings(f"http://127.0.0.2:{port}", "refused")) as refused:
        ready = _mlflow_state(refused)
        assert ready["status"] == "degraded"
        assert ready["mlflow"]["up"] is False
        reason = ready["mlflow"]["reason"]
        assert "answered 403" in reason and INVALID_HOST in reason, reason
        assert ADMIN_PASSWORD not in reason and "127.0.0.2" not in reason
    with _app(settings(f"http://127.0.0.1:{port}", "loopback")) as synced:
        ready = _mlflow_state(synced)
        assert ready["status"] == "ready"
        assert ready["mlflow"] == {"up": True, "reason": None}
