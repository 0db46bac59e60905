"""A service is closed by default, against real ``fedtune serve`` processes.

Before: a plain ``fedtune serve`` accepted every request as an admin, ignored the users' tokens
(``whoami`` said ``anonymous (admin) via open``) and took a made-up token for a good one.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.ports import free_port
from tests.service.helpers import REPO, Server

pytestmark = pytest.mark.integration


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[Server] = []

    def make(*args: str) -> Server:
        env = {
            "FEDTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'fedtune.db'}",
            "FEDTUNE_WORKDIR": str(tmp_path / "work"),
            "FEDTUNE_BACKEND": "none",
            "FEDTUNE_API_TOKEN": "",
        }
        server = Server(env, tmp_path / f"serve-{len(servers)}.log", args=args)
        servers.append(server)
        return server.start(timeout=120)

    yield make
    for server in servers:
        server.stop()


def _serve_refused(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "FEDTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'fedtune.db'}",
        "FEDTUNE_WORKDIR": str(tmp_path / "work"),
        "FEDTUNE_BACKEND": "none",
    }
    env.pop("FEDTUNE_API_TOKEN", None)
    argv = [sys.executable, "-m", "fedtune.cli", "serve", "--port", str(free_port()), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_a_service_without_a_token_makes_one_and_checks_it(start, tmp_path: Path) -> None:
    server = start()
    path = tmp_path / "work" / "admin-token"
    token = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(token) >= 32
    assert httpx.get(f"{server.url}/readyz", timeout=30).json()["auth"] == "token"
    assert httpx.get(f"{server.url}/v1/studies", timeout=30).status_code == 401
    bogus = {"Authorization": "Bearer ftk_bogus_bogus"}
    assert httpx.get(f"{server.url}/v1/studies", headers=bogus, timeout=30).status_code == 401
    admin = {"Authorization": f"Bearer {token}"}
    me = httpx.get(f"{server.url}/v1/whoami", headers=admin, timeout=30).json()
    assert me["admin"] and me["via"] == "bootstrap"
    log = server.log.read_text()
    assert str(path) in log and token not in log  # where it is, never what it is
    server.stop()
    again = start()  # the same token after a restart
    assert httpx.get(f"{again.url}/v1/whoami", headers=admin, timeout=30).status_code == 200


def test_insecure_open_says_so_and_still_checks_a_token_it_is_sent(start, tmp_path) -> None:
    server = start("--insecure-open")
    assert not (tmp_path / "work" / "admin-token").exists()
    ready = httpx.get(f"{server.url}/readyz", timeout=30).json()
    assert ready["auth"] == "open: tokens are not checked"
    me = httpx.get(f"{server.url}/v1/whoami", timeout=30).json()
    assert (me["name"], me["admin"], me["via"]) == ("anonymous", True, "open")
    bogus = {"Authorization": "Bearer ftk_bogus_bogus"}
    assert httpx.get(f"{server.url}/v1/whoami", headers=bogus, timeout=30).status_code == 401
    project = httpx.post(f"{server.url}/v1/projects", json={"name": "team1"}, timeout=30)
    assert project.status_code == 201, project.text
    made = httpx.post(
        f"{server.url}/v1/users", json={"name": "alice", "project": "team1"}, timeout=30
    )
    assert made.status_code == 201, made.text
    alice = {"Authorization": f"Bearer {made.json()['token']}"}
    me = httpx.get(f"{server.url}/v1/whoami", headers=alice, timeout=30).json()
    assert me["name"] == "alice" and not me["admin"]  # nobody is silently someone else
    assert "open: tokens are not checked: GET /v1/whoami" in server.log.read_text()
    # the CLI says it too
    env = {**os.environ, "FEDTUNE_URL": server.url}
    env.pop("FEDTUNE_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "fedtune.cli", "whoami"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.stdout.strip() == (
        "anonymous (admin) via open: tokens are not checked; projects: none"
    ), done.stderr
    server.stop()
    # now that the database holds a user, the service refuses to run open
    refused = _serve_refused(tmp_path, "--insecure-open")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "holds 1 user(s) with tokens" in refused.stderr


def test_insecure_open_binds_loopback_only(tmp_path: Path) -> None:
    refused = _serve_refused(tmp_path, "--insecure-open", "--host", "0.0.0.0")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "FEDTUNE_INSECURE_OPEN" in refused.stderr and "loopback only" in refused.stderr
