"""The systemd units of ``deploy/systemd`` run as written, from the settings file beside them.

Each unit's ``ExecStart=`` is read from the file, its install paths (``/opt/fedtune/venv``, the
virtualenv; ``/srv/fedtune``, the team's folder) replaced by this test's, and run in the unit's
``WorkingDirectory``: ``fedtune mlflow-server --config team.toml`` until ``/health`` answers,
then ``fedtune serve --config team.toml`` until ``/readyz`` does; the example ``team.toml`` is
copied with free ports. Against those real servers: the admin verbs over the API make a user
whose token works, the admin verbs from another folder find the service's database through
``FEDTUNE_CONFIG`` (and leave no ``fedtune.db`` there), and ``fedtune serve`` on that database
without MLflow refuses to start, in one line, unless told ``FEDTUNE_MLFLOW_WORKSPACES=false``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import stop_group, wait_http
from tests.ports import free_ports
from tests.service.helpers import until

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "deploy" / "systemd"
VENV = Path(sys.executable).parent.parent
FEDTUNE = str(VENV / "bin" / "fedtune")
INSTALL, TEAM_DIR = "/opt/fedtune/venv", "/srv/fedtune"


def unit_service(path: Path, srv: Path) -> tuple[list[str], Path]:
    """A unit's ``ExecStart=`` command and ``WorkingDirectory=``, with this test's paths.

    Args:
        path: The unit file.
        srv: The folder standing for ``/srv/fedtune``.

    Returns:
        The argv and the working directory.
    """
    section, found = "", {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            assert key not in found, f"{path.name}: {key}= twice"
            found[key] = value.replace(INSTALL, str(VENV)).replace(TEAM_DIR, str(srv))
    assert found["ExecStart"].startswith(f"{VENV}/bin/fedtune "), found["ExecStart"]
    assert "Environment" not in found  # the settings file holds them all
    return shlex.split(found["ExecStart"]), Path(found["WorkingDirectory"])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without fedtune's, MLflow's or Ray's variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FEDTUNE_", "MLFLOW_", "RAY_"))}
    return {**env, **extra}


def fedtune(*argv: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [FEDTUNE, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=180
    )


@dataclass
class Team:
    srv: Path
    api: str
    mlflow: str
    admin_token: str
    serve_log: Path


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    srv = tmp_path_factory.mktemp("srv")
    mlflow_port, api_port = free_ports(2)
    text = (UNITS / "team.toml").read_text()
    for old, new in (
        ("port = 5000", f"port = {mlflow_port}"),
        ("port = 8000", f"port = {api_port}"),
        ('host = "0.0.0.0"', 'host = "127.0.0.1"'),  # the test's servers stay on loopback
    ):
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    assert text.rstrip().rsplit("\n[", 1)[-1].startswith("serve]")  # [serve] is the last section
    # a project made on the database gets its MLflow workspace at the next sync: soon, here
    (srv / "team.toml").write_text(text + "mlflow_sync_s = 5\n")
    procs: list[subprocess.Popen] = []
    try:
        for unit, url in (
            ("fedtune-mlflow.service", f"http://127.0.0.1:{mlflow_port}/health"),
            ("fedtune-serve.service", f"http://127.0.0.1:{api_port}/readyz"),
        ):
            argv, cwd = unit_service(UNITS / unit, srv)
            log = srv / f"{unit}.log"
            with log.open("w") as out:
                procs.append(
                    subprocess.Popen(
                        argv,
                        cwd=cwd,
                        env=clean_env(),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
            wait_http(url, procs[-1], timeout=180, log=log)
        admin_token = (srv / "fedtune-work" / "admin-token").read_text().strip()
        api = f"http://127.0.0.1:{api_port}"
        made = httpx.post(  # a project of the API's: its MLflow workspace is made with it
            f"{api}/v1/projects",
            json={"name": "vision"},
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=120,
        )
        assert made.status_code == 201, made.text
        yield Team(
            srv=srv,
            api=api,
            mlflow=f"http://127.0.0.1:{mlflow_port}",
            admin_token=admin_token,
            serve_log=srv / "fedtune-serve.service.log",
        )
    finally:
        for proc in reversed(procs):
            stop_group(proc)


def test_the_units_start_both_servers_from_the_settings_file(team: Team) -> None:
    ready = httpx.get(f"{team.api}/readyz", timeout=30).json()
    assert ready["status"] == "ready" and ready["auth"] == "token"
    assert (team.srv / "fedtune.db").is_file()  # [serve] database_url, relative to the file
    assert (team.srv / "mlflow-server" / "admin-password").is_file()  # [mlflow] dir
    assert f"settings file {team.srv / 'team.toml'}" in team.serve_log.read_text()
    verify = shutil.which("systemd-analyze")
    if verify is None:
        print("SKIP systemd-analyze verify: systemd-analyze is not installed")
        return
    for unit in ("fedtune-mlflow.service", "fedtune-serve.service"):
        local = team.srv / unit
        local.write_text((UNITS / unit).read_text().replace(INSTALL, str(VENV)))
        done = subprocess.run([verify, "verify", str(local)], capture_output=True, text=True)
        problems = [line for line in done.stderr.splitlines() if unit in line]
        assert not problems, problems


def test_admin_verbs_over_the_api_make_a_user_whose_token_works(team: Team, tmp_path) -> None:
    env = clean_env()
    api = ["--url", team.api, "--token", team.admin_token]
    made = fedtune("projects", "create", "speech", *api, cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    assert made.stdout == "project speech\n"
    made = fedtune("users", "create", "dave", "--project", "speech", *api, cwd=tmp_path, env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    me = httpx.get(f"{team.api}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 200, me.text
    assert (me.json()["name"], me.json()["projects"]) == ("dave", {"speech": "member"})
    assert not list(tmp_path.iterdir())  # no database made here
    # the same list both ways: through the API, and on the database the settings file names
    over_api = fedtune("users", "list", "--json", *api, cwd=tmp_path, env=env)
    on_db = fedtune(
        "users", "list", "--json", "--config", str(team.srv / "team.toml"), cwd=tmp_path, env=env
    )
    assert over_api.returncode == on_db.returncode == 0, over_api.stderr + on_db.stderr
    assert json.loads(over_api.stdout) == json.loads(on_db.stdout)
    assert "dave" in {u["name"] for u in json.loads(on_db.stdout)}
    # the API made the project's MLflow workspace, and the database remembers it
    assert {"vision", "speech"} <= _recorded(team.srv / "fedtune.db")


def test_admin_verbs_from_another_folder_find_the_service_database(team: Team, tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = clean_env(FEDTUNE_CONFIG=str(team.srv / "team.toml"))
    made = fedtune("projects", "create", "audio", cwd=elsewhere, env=env)
    assert made.returncode == 0, made.stderr
    made = fedtune("users", "create", "erin", "--project", "audio", cwd=elsewhere, env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip().splitlines()[-1]
    me = httpx.get(f"{team.api}/v1/whoami", headers={"Authorization": f"Bearer {token}"})
    assert me.status_code == 200, me.text  # the running service knows erin: one database
    assert me.json()["projects"] == {"audio": "member"}
    assert not list(elsewhere.iterdir())  # no fedtune.db left behind
    # the service's next MLflow sync makes audio's workspace, and the database remembers it
    assert until(lambda: "audio" in _recorded(team.srv / "fedtune.db"), timeout=120)


def test_serve_without_mlflow_refuses_a_database_whose_projects_have_workspaces(
    team: Team, tmp_path
) -> None:
    copy = _snapshot(team.srv / "fedtune.db", tmp_path / "copy.db")
    recorded = sorted(_recorded(copy))
    assert "vision" in recorded
    port = free_ports(1)[0]
    argv = ["serve", "--database-url", f"sqlite:///{copy}", "--port", str(port)]
    refused = fedtune(*argv, "--workdir", str(tmp_path / "w"), cwd=tmp_path, env=clean_env())
    assert refused.returncode == 2
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert lines[0].startswith(
        "fedtune: error: FEDTUNE_MLFLOW_WORKSPACES: the projects of this database have MLflow "
        f"workspaces ({', '.join(recorded)}) but no MLflow server is configured: start with "
        "--config FILE (its [mlflow] section), or set MLFLOW_TRACKING_URI, "
    ), lines[0]
    assert lines[0].endswith("FEDTUNE_MLFLOW_WORKSPACES=false starts without MLflow on purpose")
    assert not (tmp_path / "w").exists()  # refused before anything was made


def test_serve_without_mlflow_on_purpose_starts_and_says_so(team: Team, tmp_path) -> None:
    copy = _snapshot(team.srv / "fedtune.db", tmp_path / "copy.db")
    recorded = sorted(_recorded(copy))
    env = clean_env(FEDTUNE_MLFLOW_WORKSPACES="false")
    port = free_ports(1)[0]
    log = tmp_path / "serve.log"
    argv = [FEDTUNE, "serve", "--database-url", f"sqlite:///{copy}", "--port", str(port)]
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*argv, "--workdir", str(tmp_path / "w"), "--backend", "none"],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_http(f"http://127.0.0.1:{port}/readyz", proc, timeout=120, log=log)
    finally:
        stop_group(proc)
    said = [line for line in log.read_text().splitlines() if "MLflow workspaces of" in line]
    assert len(said) == 1, log.read_text()[-3000:]
    assert (
        f"FEDTUNE_MLFLOW_WORKSPACES is false: the MLflow workspaces of {', '.join(recorded)} "
        in said[0]
    )


def _snapshot(database: Path, copy: Path) -> Path:
    """A copy of a live SQLite database (its WAL included), for a second service."""
    with closing(sqlite3.connect(database)) as source, closing(sqlite3.connect(copy)) as target:
        source.backup(target)
    return copy


def _recorded(database: Path) -> set[str]:
    with closing(sqlite3.connect(database)) as db:
        rows = db.execute("SELECT name FROM projects WHERE mlflow_workspace IS NOT NULL")
        return {name for (name,) in rows}
