"""Failures that explain themselves, on a real Ray head with token authentication.

The cluster's processes lack both ``fedtune`` on their ``PATH`` and ``FEDTUNE_DATABASE_URL``
(two real misconfigurations):

* a job whose entrypoint command is not found fails its study with the first attempt, and the
  study's error carries the job log's ``/bin/sh: 1: fedtune: not found``;
* a driver started without ``FEDTUNE_DATABASE_URL`` stops with one line naming the variable,
  creates no SQLite file, and its study fails with the first attempt with that line;
* a service without ``RAY_AUTH_TOKEN`` reports the backend down (``/readyz``,
  ``fedtune_backend_up``), keeps its studies ``queued`` with the reason, and logs the change of
  state once across several ticks; an unreachable address gives another reason.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from fedtune.service.api import create_app
from fedtune.service.backend_health import BackendHealth
from fedtune.service.backends.base import (
    BackendAuthError,
    BackendUnreachableError,
    DriverStatus,
    driver_argv,
)
from fedtune.service.backends.ray_jobs import RayJobsBackend
from fedtune.service.db import Database
from fedtune.service.migrate import upgrade_database
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, cancel_study, submit_study
from fedtune.service.settings import load_settings
from fedtune.service.states import StudyState
from tests.ports import free_port

from .helpers import tiny_spec, until
from .ray_cluster import BACKEND_MODULES, BIN, LocalRayCluster, session_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("ray-failures")
    url, workdir, cwd = f"sqlite:///{root / 'fedtune.db'}", root / "work", root / "cwd"
    cwd.mkdir()
    db = Database(url)
    upgrade_database(db)
    cluster = LocalRayCluster(
        {"FEDTUNE_WORKDIR": str(workdir)}, lean=True, dashboard_modules=BACKEND_MODULES
    )
    cluster.env.pop("FEDTUNE_DATABASE_URL", None)  # the cluster's processes lack it ...
    cluster.env["PATH"] = "/usr/bin:/bin"  # ... and have no ``fedtune`` on their PATH
    here = os.getcwd()
    os.chdir(cwd)  # the cluster's processes (and so its jobs) start in a directory we watch
    try:
        cluster.start()
    finally:
        os.chdir(here)
    try:
        settings = load_settings(
            database_url=url,
            workdir=str(workdir),
            backend="ray",
            ray_address=cluster.address,
            max_concurrent_studies=4,
            max_dispatch_attempts=3,
            scheduler_interval_s=0.05,
            ray_auth_token=cluster.client_env["RAY_AUTH_TOKEN"],
        )
        yield ServiceContext(db, settings), cluster, cwd
    finally:
        session = cluster.session
        cluster.stop()
        assert not session_pids(session), "processes of the test cluster survived"
        db.dispose()


def _sqlite_files(*dirs: Path) -> list[Path]:
    return [p for d in dirs if d.exists() for p in d.rglob("*.db")]


def _fail_one(ctx: ServiceContext, backend: RayJobsBackend, name: str):
    """Dispatch one study to ``backend``, wait for its job to fail, reconcile; the study."""
    scheduler = Scheduler(ctx.db, backend, ctx.settings)
    sid = submit_study(ctx, tiny_spec(name=name))[0].id
    assert scheduler.tick().dispatched == [sid]
    with ctx.db.session(readonly=True) as s:
        ref = Repository(s).require_study(sid).driver_ref
    assert until(lambda: not backend.poll(ref).alive, 180)
    assert backend.poll(ref) == DriverStatus.FAILED
    report = scheduler.tick()
    assert [(r.study_id, r.action) for r in report.recovered] == [(sid, "failed")]
    with ctx.db.session(readonly=True) as s:
        return Repository(s).require_study(sid)


def test_a_missing_entrypoint_command_fails_at_once_with_the_jobs_line(world) -> None:
    ctx, _, _ = world
    study = _fail_one(ctx, RayJobsBackend(ctx.settings), "no-fedtune-on-path")
    assert (study.state, study.attempts) == (StudyState.FAILED, 1)
    assert "fedtune: not found" in study.error
    assert "exit code 127" in study.error and "not retried (command not found)" in study.error


def test_a_driver_without_a_database_url_fails_at_once_naming_it(world) -> None:
    ctx, cluster, cwd = world
    before = _sqlite_files(cwd, cluster.temp_dir)
    fedtune = str(BIN / "fedtune")  # found, unlike the cluster's PATH: the database is missing
    backend = RayJobsBackend(ctx.settings, argv=lambda sid, n: [fedtune, *driver_argv(sid, n)[1:]])
    study = _fail_one(ctx, backend, "no-database-url")
    assert (study.state, study.attempts) == (StudyState.FAILED, 1)
    assert "fedtune: error: FEDTUNE_DATABASE_URL: not set" in study.error
    assert "exit code 2" in study.error and "database is unavailable" not in study.error
    assert _sqlite_files(cwd, cluster.temp_dir) == before, "the driver created a SQLite file"


def test_a_service_without_the_clusters_token_reports_the_backend_down(world, caplog) -> None:
    ctx, _, _ = world
    anonymous = ctx.settings.model_copy(update={"ray_auth_token": None})
    backend = RayJobsBackend(anonymous)
    app = create_app(anonymous, backend=backend, schedule=False)
    with TestClient(app) as client, caplog.at_level(logging.INFO):
        assert until(lambda: client.get("/readyz").status_code == 200, 120)
        scheduler = app.state.runtime.scheduler
        sid = submit_study(app.state.runtime.ctx, tiny_spec(name="no-token"))[0].id
        for _ in range(4):  # several ticks, each probing the cluster again
            scheduler._not_before = 0.0
            assert scheduler.tick().dispatched == []
        said = [
            r.getMessage()
            for r in caplog.records
            if r.name.startswith("fedtune")
            and r.levelno >= logging.WARNING
            and "MLFLOW_TRACKING_URI" not in r.getMessage()
            and "GET /readyz -> 503" not in r.getMessage()
        ]
        assert len(said) == 1 and "unusable: authentication failed" in said[0], said
        study = client.get(f"/v1/studies/{sid}").json()
        assert study["state"] == "queued" and study["attempts"] == 0
        assert "authentication failed" in study["queued_reason"]
        assert "RAY_AUTH_TOKEN is not set" in study["queued_reason"]
        ready = client.get("/readyz")
        assert ready.status_code == 200  # reads still work: the replica stays in its Service
        body = ready.json()
        assert body["status"] == "degraded"
        assert body["backend"]["kind"] == "ray" and body["backend"]["up"] is False
        assert "authentication failed" in body["backend"]["reason"]
        assert 'fedtune_backend_up{backend="ray"} 0.0' in client.get("/metrics").text
        # the backend was up, then a launch is refused: back in the queue, the attempt kept
        scheduler.health.answered()
        caplog.clear()
        scheduler._not_before = 0.0
        assert scheduler.tick().dispatched == []
        study = client.get(f"/v1/studies/{sid}").json()
        assert (study["state"], study["attempts"]) == ("queued", 0)
        assert "authentication failed" in study["queued_reason"]
        lines = [
            r.getMessage()
            for r in caplog.records
            if r.name.startswith("fedtune")
            and r.levelno >= logging.WARNING
            and "capacity unknown" not in r.getMessage()
        ]
        assert len(lines) == 1 and "unusable: authentication failed" in lines[0], lines
        # the token arrives: one line, and the study is dispatched
        caplog.clear()
        backend.settings = ctx.settings
        backend._client = None
        scheduler._not_before = 0.0
        assert scheduler.tick().dispatched == [sid]
        assert [r.getMessage() for r in caplog.records if "usable" in r.getMessage()] == [
            "backend 'ray' usable again"
        ]
        assert client.get("/readyz").json()["status"] == "ready"
        assert 'fedtune_backend_up{backend="ray"} 1.0' in client.get("/metrics").text
        cancel_study(app.state.runtime.ctx, sid)


def test_refused_credentials_and_an_unreachable_address_read_differently(world) -> None:
    ctx, _, _ = world
    wrong = RayJobsBackend(ctx.settings.model_copy(update={"ray_auth_token": SecretStr("0" * 64)}))
    with pytest.raises(BackendAuthError, match=r"403 \(RAY_AUTH_TOKEN refused\)"):
        wrong.check()
    with pytest.raises(BackendAuthError):  # the Jobs API client says the same
        wrong.poll({"submission_id": "fedtune-000000000000-1"})
    nowhere = RayJobsBackend(
        ctx.settings.model_copy(update={"ray_address": f"http://127.0.0.1:{free_port()}"})
    )
    with pytest.raises(BackendUnreachableError):
        nowhere.check()
    with pytest.raises(BackendUnreachableError):
        nowhere.poll({"submission_id": "fedtune-000000000000-1"})
    refused, unreachable = BackendHealth(wrong), BackendHealth(nowhere)
    assert refused.probe() is False and unreachable.probe() is False
    assert refused.state.reason.startswith("authentication failed: ")
    assert unreachable.state.reason.startswith("unreachable: ")
    assert RayJobsBackend(ctx.settings).check() is None
