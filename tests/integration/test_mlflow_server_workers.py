"""``fedtune mlflow-server`` makes MLflow's login store once, before uvicorn starts its workers
(``fedtune.service.mlflow_run.prepare_store``): the chart runs MLflow with two, and when each
worker made the store itself, on a new PostgreSQL database all but one crashed creating its
tables (``UniqueViolation``) and uvicorn restarted them (71 s of the cluster in a box's start,
``tests/deploy/test_cluster_box.py``)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx

from fedtune.service.child_env import mlflow_server_env
from fedtune.service.mlflow_server import MlflowServer
from tests.integration.conftest import stop_group
from tests.integration.test_mlflow_tenancy import ADMIN_PASSWORD, start_server
from tests.needs import need
from tests.service.helpers import pg_database, pg_unreachable_reason

CRASHES = ("Traceback", "UniqueViolation", "IntegrityError")


def test_the_login_store_and_its_admin_exist_before_any_worker_starts(tmp_path: Path) -> None:
    store = tmp_path / "mlflow.db"
    server = MlflowServer(tmp_path / "m", port=5000, backend_store_uri=f"sqlite:///{store}")
    environ = {**mlflow_server_env(), "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD}
    env = server.env(server.prepare(environ), environ)
    # the server process's start (store upgraded, login store made, stores opened), no uvicorn
    start = (
        "import gc, json, sys; from fedtune.service import mlflow_run as m; "
        "failed = m.start(m.parse_options(sys.argv[1:])); "
        "seen = [failed, gc.get_freeze_count(), len(gc.get_objects())]; "
        # then what uvicorn's factory call does in this process (one worker) or in a worker
        "from fedtune.service.mlflow_app import create_app; app = create_app(); "
        "seen += [gc.isenabled(), gc.get_freeze_count(), len(gc.get_objects())]; "
        "print(json.dumps(seen))"
    )
    done = subprocess.run(
        [sys.executable, "-c", start, *server.options()],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    failed, frozen, walked, enabled, app_frozen, app_walked = json.loads(
        done.stdout.strip().splitlines()[-1]
    )
    assert failed is None, done.stderr[-2000:]
    with sqlite3.connect(store) as db:
        admins = db.execute("select username from users where is_admin").fetchall()
    assert admins == [(server.admin_username,)]
    # MLflow's server was imported and frozen before the steps (mlflow_run.import_server): the
    # start's closing collection, and the collector's later passes, walk only what they added
    # (~4,000 objects), not the imports' ~350,000 (0.2-0.35 CPU-s of the start)
    assert frozen > 200_000 and walked < 50_000, (frozen, walked)
    # the app's factory (fedtune.service.mlflow_app.create_app) imports the rest of MLflow's app
    # with the collector paused, then freezes it too: a worker's start is not walked either
    assert enabled and app_frozen > frozen and app_walked < 1_000, (app_frozen, app_walked)


def test_two_workers_on_a_new_postgresql_database_start_without_a_crash(tmp_path: Path) -> None:
    need("postgres", pg_unreachable_reason())
    with pg_database("fedtune_mlflow_workers") as url:
        proc, base = start_server(tmp_path, "--workers", "2", "--backend-store-uri", url)
        try:
            for _ in range(4):  # answered by either worker: both hold the store
                answer = httpx.get(
                    f"{base}/api/2.0/mlflow/users/get",
                    params={"username": "admin"},
                    auth=("admin", ADMIN_PASSWORD),
                    timeout=30,
                )
                assert answer.status_code == 200, answer.text
                assert answer.json()["user"]["is_admin"] is True
        finally:
            stop_group(proc)
    text = (tmp_path / "server.log").read_text()
    assert not [c for c in CRASHES if c in text], text[-4000:]
