"""The ``ray`` backend against a real local Ray cluster (Ray Jobs API), with a real study."""

from __future__ import annotations

from pathlib import Path

import pytest

from fedtune.errors import BackendError
from fedtune.service.backends.base import DriverStatus, LaunchRequest
from fedtune.service.backends.ray_jobs import RayJobsBackend, submission_id
from fedtune.service.db import Database
from fedtune.service.migrate import upgrade_database
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.settings import load_settings
from fedtune.service.states import StudyState, TrialState

from .helpers import tiny_spec, until
from .ray_cluster import BACKEND_MODULES, LocalRayCluster, session_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("ray-backend")
    url, workdir = f"sqlite:///{root / 'fedtune.db'}", root / "work"
    db = Database(url)
    upgrade_database(db)
    # the cluster's processes carry the driver's settings (the Helm chart: envFrom the Secret)
    cluster = LocalRayCluster(
        {"FEDTUNE_DATABASE_URL": url, "FEDTUNE_WORKDIR": str(workdir)},
        lean=True,
        dashboard_modules=BACKEND_MODULES,
    )
    cluster.start()
    try:
        settings = load_settings(
            database_url=url,
            workdir=str(workdir),
            backend="ray",
            ray_address=cluster.address,
            max_concurrent_studies=1,
            ray_auth_token=cluster.client_env["RAY_AUTH_TOKEN"],
        )
        yield ServiceContext(db, settings), cluster
    finally:
        session = cluster.session
        cluster.stop()
        assert not session_pids(session), "processes of the test cluster survived"
        db.dispose()


def test_a_study_runs_as_a_ray_job(world) -> None:
    ctx, cluster = world
    backend = RayJobsBackend(ctx.settings)
    assert backend.poll({"submission_id": "fedtune-000000000000-1"}) == DriverStatus.GONE
    anonymous = RayJobsBackend(ctx.settings.model_copy(update={"ray_auth_token": None}))
    with pytest.raises(BackendError, match=r"(?i)auth"):  # the cluster checks its token
        anonymous.poll({"submission_id": "fedtune-000000000000-1"})
    sid = submit_study(ctx, tiny_spec(name="on-ray", trials=2, rounds=3))[0].id
    scheduler = Scheduler(ctx.db, backend, ctx.settings)
    assert scheduler.tick().dispatched == [sid]
    with ctx.db.session(readonly=True) as s:
        ref = Repository(s).require_study(sid).driver_ref
    assert ref == {"submission_id": submission_id(sid, 1), "address": cluster.address}
    final = until(
        lambda: (
            (st := backend.poll(ref)) not in (DriverStatus.PENDING, DriverStatus.RUNNING) and st
        ),
        240,
    )
    logs = backend._jobs().get_job_logs(ref["submission_id"])
    assert final == DriverStatus.SUCCEEDED, logs[-3000:]
    scheduler.tick()  # nothing to recover: the driver wrote its final state
    with ctx.db.session(readonly=True) as s:
        repo = Repository(s)
        study = repo.require_study(sid)
        trials = repo.list_trials(sid)
    assert study.state == StudyState.SUCCEEDED, study.error
    assert [t.state for t in trials] == [TrialState.COMPLETED] * 2
    assert all(t.last_round == 3 for t in trials)


def test_stopping_a_ray_job(world) -> None:
    ctx, _ = world
    backend = RayJobsBackend(ctx.settings)
    sid = submit_study(ctx, tiny_spec(name="stopped", trials=50, rounds=50))[0].id
    with ctx.db.session() as s:
        Repository(s).transition(sid, StudyState.RUNNING, attempts=1, backend="ray")
    ref = backend.launch(LaunchRequest(sid, 1))
    assert until(lambda: backend.poll(ref) == DriverStatus.RUNNING, 60)
    backend.stop(ref)
    assert until(lambda: backend.poll(ref) == DriverStatus.FAILED, 60)  # STOPPED
    backend.stop(ref)  # idempotent


def test_without_a_tracking_uri_the_backend_warns(tmp_path: Path, caplog, monkeypatch) -> None:
    """Each driver's default MLflow store is in the Ray head's workdir: a service that does not
    share it finds no runs there (found by ``tests/e2e/test_byo_ray_backend.py``)."""
    base = dict(
        database_url=f"sqlite:///{tmp_path / 'db'}",
        workdir=str(tmp_path),
        backend="ray",
        ray_address="http://127.0.0.1:8265",
    )
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with caplog.at_level("WARNING", logger="fedtune.service.backends.ray_jobs"):
        RayJobsBackend(load_settings(**base))
    assert "backend 'ray' without MLFLOW_TRACKING_URI" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedtune.service.backends.ray_jobs"):
        RayJobsBackend(load_settings(**base, mlflow_tracking_uri="http://mlflow:5000"))
    assert caplog.text == ""


def test_without_cluster_gpus_set_admission_uses_the_ray_clusters_gpus(world, monkeypatch) -> None:
    """Cluster capacity comes from settings or from Ray's cluster resources.
    The head has no GPU: a study asking for one waits with the cluster's reason; once a node
    with 2 (logical) GPUs joins, the same study is admitted."""
    from fedtune.service import admission
    from fedtune.service.backends import ray_jobs
    from fedtune.service.services import cancel_study

    ctx, cluster = world
    assert ctx.settings.cluster_gpus is None
    monkeypatch.setattr(ray_jobs, "CAPACITY_TTL_S", 0.0)
    backend = RayJobsBackend(ctx.settings)
    assert backend.capacity_gpus() == 0.0
    sid = submit_study(ctx, tiny_spec(name="wants-a-gpu", trials=1, resources={"gpu": 1}))[0].id

    def decide() -> admission.Decision:
        with ctx.db.session(readonly=True) as s:
            waiting = Repository(s).studies_in(StudyState.QUEUED, 100)
            return admission.plan_dispatch(s, waiting, 1, ctx.settings, backend.capacity_gpus())

    try:
        before = decide()
        assert sid not in before.admit
        assert before.waiting[sid] == "waiting for cluster capacity: 0/0 GPUs"
        cluster.add_node("gpus", num_cpus=1, num_gpus=2)
        until(lambda: backend.capacity_gpus() == 2.0, 60)
        assert decide().admit == [sid]
        # the cluster's dashboard unreachable: capacity unknown (None), not an error
        gone = RayJobsBackend(ctx.settings.model_copy(update={"ray_address": "http://127.0.0.1:9"}))
        assert gone.capacity_gpus() is None
    finally:
        cancel_study(ctx, sid)
