"""Run what the chart's pods run, on this machine, against the real PostgreSQL: the
bundled PostgreSQL's init script creates two non-superuser roles with a
database each, and then — logged in as those roles, not as a superuser — the MLflow init
container's `mlflow db upgrade` and the hook Job's `fedtune db upgrade` build their schemas.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO_ROOT, one
from tests.needs import need

PG_HOST, PG_PORT, PG_ADMIN = "127.0.0.1", "5432", "postgres"
FEDTUNE_BIN = Path(sys.executable).with_name("fedtune")


def _psql(sql: str, *, user: str = PG_ADMIN, db: str = "postgres") -> subprocess.CompletedProcess:
    return subprocess.run(
        ["psql", "-h", PG_HOST, "-p", PG_PORT, "-U", user, "-d", db, "-tAc", sql],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def pg_server() -> None:
    if shutil.which("psql") is None:
        need("postgres", "no psql client (apt-get install postgresql-client)")
    probe = _psql("SELECT 1")
    need(
        "postgres",
        None if probe.returncode == 0 else f"PostgreSQL unreachable: {probe.stderr.strip()}",
    )


@pytest.fixture
def roles(render, pg_server):
    """Render the chart with unique role/database names; yield (values, env of the PG pod); drop all."""
    tag = uuid.uuid4().hex[:8]
    auth = {
        "username": f"ft_{tag}",
        "database": f"ft_{tag}",
        "mlflowUsername": f"ml_{tag}",
        "mlflowDatabase": f"ml_{tag}",
    }
    manifests = render({"postgresql": {"auth": auth}})
    try:
        yield manifests, auth
    finally:
        for db in (auth["database"], auth["mlflowDatabase"]):
            _psql(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        for role in (auth["username"], auth["mlflowUsername"]):
            _psql(f'DROP ROLE IF EXISTS "{role}"')


def _pod_env(manifests, auth) -> dict[str, str]:
    """The PostgreSQL container's environment, with Secret references resolved from the render."""
    import base64

    pg = one(manifests, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]
    secrets = {s["metadata"]["name"]: s for s in manifests if s["kind"] == "Secret"}
    env = {}
    for item in pg["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
    return env


@pytest.mark.integration
def test_init_script_makes_two_non_superuser_roles_that_run_both_migrations(
    roles, tmp_path
) -> None:
    manifests, auth = roles
    script = tmp_path / "01-roles.sh"
    script.write_text(one(manifests, "ConfigMap")["data"]["01-roles.sh"])
    env = _pod_env(manifests, auth) | {
        "PATH": os.environ["PATH"],
        "PGHOST": PG_HOST,
        "PGPORT": PG_PORT,
        "POSTGRES_USER": PG_ADMIN,  # this machine's superuser stands in for the pod's
    }
    done = subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr

    for role, db in (
        (auth["username"], auth["database"]),
        (auth["mlflowUsername"], auth["mlflowDatabase"]),
    ):
        row = _psql(
            f"SELECT r.rolsuper, r.rolcreatedb, r.rolcreaterole, pg_get_userbyid(d.datdba) "
            f"FROM pg_roles r, pg_database d WHERE r.rolname = '{role}' AND d.datname = '{db}'"
        ).stdout.strip()
        assert row == f"f|f|f|{role}", row
    # neither role may even connect to the other's database
    denied = _psql("SELECT 1", user=auth["username"], db=auth["mlflowDatabase"])
    assert denied.returncode != 0 and "permission denied" in denied.stderr

    secret = one(manifests, "Secret", "demo-fedtune-env")["stringData"]
    local = f"@{PG_HOST}:{PG_PORT}/"

    def here(url: str) -> str:  # the in-cluster Service name -> this machine
        return url.replace("@demo-fedtune-postgresql:5432/", local)

    # the MLflow init container's command, as the mlflow role
    mlflow_pod = one(manifests, "Deployment", "demo-fedtune-mlflow")["spec"]["template"]["spec"]
    init = mlflow_pod["initContainers"][0]
    run_env = {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MLFLOW_BACKEND_STORE_URI": here(secret["MLFLOW_BACKEND_STORE_URI"]),
        "PYTHONPATH": str(REPO_ROOT),  # this checkout's fedtune, whatever the venv points at
        "HOME": str(tmp_path),
    }
    done = subprocess.run(
        init["command"], env=run_env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    tables = _psql(
        "SELECT count(*) FROM pg_tables WHERE tablename = 'experiments'", db=auth["mlflowDatabase"]
    )
    assert tables.stdout.strip() == "1"

    # the hook Job's command (image ENTRYPOINT `fedtune` + args), as the fedtune role
    job = next(m for m in manifests if m["kind"] == "Job")
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    run_env["FEDTUNE_DATABASE_URL"] = here(secret["FEDTUNE_DATABASE_URL"])
    done = subprocess.run(
        [str(FEDTUNE_BIN), *args], env=run_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    check = subprocess.run(
        [str(FEDTUNE_BIN), "db", "current"],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
