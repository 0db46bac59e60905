"""Packed studies are scheduled like any study, their GPUs reserved per trial process.

A study with ``resources: {gpu: 1, pack: 4}`` and ``budget.max_concurrent: 8`` trains 8
configurations at once in 2 processes of one GPU each: it reserves 2 GPUs and 8 trials. Here the
reservation of a validated spec, the real scheduler with a scripted backend on a real database
(project quotas, fair share, what it launches and the RayJob rendered from that), and a pack
larger than ``max_concurrent`` refused by the REST API (422) and by ``fedtune submit`` (exit 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from fastapi.testclient import TestClient

from fedtune.cli import main, remote
from fedtune.client import Client
from fedtune.service import identity
from fedtune.service.access import Principal
from fedtune.service.api import create_app
from fedtune.service.backends.k8s_manifest import rayjob_manifest
from fedtune.service.db import Database
from fedtune.service.project_usage import project_usage, reservation, trial_processes
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, get_study, submit_study
from fedtune.service.specs import accept_spec, stored_spec
from fedtune.service.states import StudyState

from ..needs import need
from .helpers import FakeBackend, tiny_spec
from .k8s_fake import CRD, rayjob_schema


def _spec(name: str = "packed", pack: int | str = 4, gpu: float = 1.0, **extra: Any) -> dict:
    """A tiny study of 8 configurations at once, ``pack`` per process of ``gpu`` GPUs."""
    return tiny_spec(
        name=name,
        trials=8,
        resources={"cpu": 1, "gpu": gpu, "pack": pack},
        budget={"trials": 8, "max_concurrent": 8},
        **extra,
    )


# ---------------------------------------------------------------- the reservation


@pytest.mark.parametrize(
    ("pack", "processes", "gpus"),
    [(4, 2, 2.0), (8, 1, 1.0), (3, 3, 3.0), (1, 8, 8.0), ("auto", 8, 8.0)],
)
def test_a_study_reserves_gpus_per_trial_process_and_trials_per_configuration(
    pack: int | str, processes: int, gpus: float
) -> None:
    document = accept_spec(_spec(pack=pack)).document
    assert document["resources"]["pack"] == pack
    assert trial_processes(stored_spec(document)) == processes
    assert reservation(stored_spec(document)) == (gpus, 8)


def test_a_spec_stored_before_packing_reserves_as_before() -> None:
    document = accept_spec(_spec(pack=1)).document
    del document["resources"]["pack"]
    assert reservation(stored_spec(document)) == (8.0, 8)
    assert reservation(stored_spec({})) == (0.0, 1)


# ---------------------------------------------------------------- the scheduler, for real


@pytest.fixture
def world(sqlite_db: Database, make_settings: Callable):
    """Projects ``a`` and ``b``, 2 GPUs each; three study slots."""
    settings = make_settings(database_url=sqlite_db.url, max_concurrent_studies=3)
    backend = FakeBackend()
    scheduler = Scheduler(sqlite_db, backend, settings)
    ctx = ServiceContext(sqlite_db, settings, scheduler)
    with sqlite_db.session() as s:
        for name in ("a", "b"):
            identity.create_project(s, name)
            identity.set_quota(s, name, quota_gpus=2, quota_trials=8)
    return ctx, scheduler, backend


def _submit(ctx: ServiceContext, spec: dict) -> str:
    return submit_study(ctx, spec, caller=Principal("admin", admin=True))[0].id


def test_a_gpu_quota_admits_the_packed_study_and_holds_the_unpacked_one(world) -> None:
    ctx, scheduler, backend = world
    packed = _submit(ctx, _spec("packed", pack=4, project="a"))
    unpacked = _submit(ctx, _spec("unpacked", pack=1, project="b"))
    scheduler.tick()
    with ctx.db.session(readonly=True) as s:
        row = Repository(s).get_study(packed)
        assert row is not None and row.state == StudyState.RUNNING
        assert (row.reserved_gpus, row.reserved_trials) == (2.0, 8)
    waiting = get_study(ctx, unpacked)
    assert waiting.state == StudyState.QUEUED
    assert waiting.queued_reason == "waiting for project quota: 0/2 GPUs"
    with ctx.db.session(readonly=True) as s:
        usage = project_usage(s, "a", ctx.settings)
    # no budget.time: it may hold its 2 GPUs until FEDTUNE_STUDY_DEADLINE_S
    held = 2.0 * ctx.settings.study_deadline_s / 3600
    assert usage.pop("gpu_hours") == pytest.approx(held, rel=1e-3)
    assert usage == {"studies": {"queued": 0, "running": 1}, "gpus": 2.0, "trials": 8}
    [launched] = backend.launched
    assert launched.study_id == packed
    assert (launched.max_concurrent, launched.processes, launched.gpu) == (8, 2, 1.0)


def test_fair_share_counts_a_packed_studys_gpus_per_process(world) -> None:
    """``a`` runs 8 configurations in one process of 1 GPU, ``b`` 8 unpacked ones of 0.25 GPU
    (2 GPUs). Counted per configuration, ``a`` would hold 8 GPUs and the one free slot would go
    to ``b``; counted per process, ``a`` is further below its share and gets it, although
    ``b``'s study was submitted first."""
    ctx, scheduler, _ = world
    with ctx.db.session() as s:
        for name in ("a", "b"):
            identity.set_quota(s, name, quota_gpus=16, quota_trials=16)
    _submit(ctx, _spec("a-packed", pack=8, project="a"))  # 1 process: 1 GPU
    _submit(ctx, _spec("b-unpacked", pack=1, gpu=0.25, project="b"))  # 8 × 0.25: 2 GPUs
    scheduler.tick()
    b_next = _submit(ctx, tiny_spec(name="b-next", project="b"))
    a_next = _submit(ctx, tiny_spec(name="a-next", project="a"))
    scheduler.tick()  # one free study slot: to the project furthest below its share
    assert get_study(ctx, a_next).state == StudyState.RUNNING
    assert get_study(ctx, b_next).state == StudyState.QUEUED


def test_the_rayjob_of_a_packed_dispatch_has_workers_for_its_processes(
    world, make_settings: Callable
) -> None:
    need("crds", None if CRD.is_file() else f"no KubeRay RayJob CRD at {CRD}")
    ctx, scheduler, backend = world
    _submit(ctx, _spec("packed", pack=4, project="a"))
    scheduler.tick()
    [request] = backend.launched
    settings = make_settings(
        backend="kubernetes", k8s_namespace="ml", k8s_image="reg.example.com/fedtune:1"
    )
    manifest = rayjob_manifest(request, settings)
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)
    [group] = manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert group["replicas"] == group["maxReplicas"] == 2  # 2 processes, not 8 configurations
    assert limits["nvidia.com/gpu"] == "1" and group["rayStartParams"]["num-gpus"] == "1"


# ---------------------------------------------------------------- refused at submission


@pytest.fixture
def client(make_settings: Callable, fake_backend: FakeBackend) -> Iterator[TestClient]:
    app = create_app(make_settings(), backend=fake_backend, schedule=False)
    with TestClient(app) as c:
        yield c


def test_a_pack_larger_than_max_concurrent_is_a_422_naming_resources_pack(
    client: TestClient,
) -> None:
    r = client.post("/v1/studies", json=_spec(pack=16))
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_config" and error["field"] == "resources.pack", error
    assert "max_concurrent" in error["message"]
    ok = client.post("/v1/studies", json=_spec(pack=4))
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["resources"]["pack"] == 4


def test_fedtune_submit_of_a_pack_too_large_is_one_line_exit_2(
    client: TestClient, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys
) -> None:
    monkeypatch.setattr(
        remote, "_client", lambda args: Client(args.url, transport=client._transport, retries=0)
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_spec(pack=16)))
    assert main(["submit", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "resources.pack" in err[0], err
