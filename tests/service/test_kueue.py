"""The ``kubernetes`` backend: Kueue admits the studies, fedtune says why one waits.

With ``FEDTUNE_K8S_KUEUE`` every RayJob carries ``kueue.x-k8s.io/queue-name`` (the project's
LocalQueue) and is created suspended, as Kueue's RayJob integration expects; the manifests
validate against KubeRay's CRD. Against the fake API server (which validates the Workload the
test writes, playing Kueue, against Kueue's own CRD): a RayJob Kueue has not admitted shows its
study ``queued`` with Kueue's reason; once Kueue unsuspends it and KubeRay runs it, ``running``.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from fedtune.service import identity
from fedtune.service.access import Principal
from fedtune.service.backends.base import LaunchRequest
from fedtune.service.backends.k8s_manifest import KUEUE_QUEUE_LABEL, rayjob_manifest
from fedtune.service.backends.kubernetes import KubernetesBackend
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, get_study, submit_study
from fedtune.service.states import StudyState

from ..needs import need
from .helpers import tiny_spec
from .k8s_fake import CRD, KUEUE_CRDS, FakeKubeApi, rayjob_schema

SID = "0123456789ab"
WAITING = (
    "couldn't assign flavors to pod set head: insufficient quota for nvidia.com/gpu in "
    "flavor gpu-a100, 4 more needed"
)


@pytest.fixture(autouse=True)
def _crds_present() -> None:
    missing = [p for p in (CRD, KUEUE_CRDS / "kueue.x-k8s.io_workloads.yaml") if not p.exists()]
    need("crds", f"CRDs missing: {missing} (set FEDTUNE_CRD_DIR)" if missing else None)


@pytest.fixture
def kueue_settings(make_settings):
    return make_settings(
        backend="kubernetes",
        k8s_namespace="ml",
        k8s_kueue=True,
        k8s_image="registry.example.com/fedtune:0.1.0",
    )


def test_a_rayjob_joins_its_projects_local_queue_suspended(kueue_settings, make_settings) -> None:
    manifest = rayjob_manifest(LaunchRequest(SID, 1, gpu=1.0, project="vision"), kueue_settings)
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)
    assert manifest["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "fedtune-vision"
    assert manifest["spec"]["suspend"] is True
    cluster = manifest["spec"]["rayClusterSpec"]
    for pod in [
        cluster["headGroupSpec"]["template"],
        *(g["template"] for g in cluster["workerGroupSpecs"]),
    ]:
        assert KUEUE_QUEUE_LABEL not in pod["metadata"].get("labels", {})  # the job's, not pods'
    named = rayjob_manifest(LaunchRequest(SID, 1, project="vision", queue="team-q"), kueue_settings)
    assert named["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "team-q"
    plain = rayjob_manifest(LaunchRequest(SID, 1), make_settings(backend="kubernetes"))
    assert KUEUE_QUEUE_LABEL not in plain["metadata"]["labels"] and "suspend" not in plain["spec"]


def _workload(uid: str, queue: str) -> dict:
    """The Workload Kueue makes for a RayJob that does not fit its ClusterQueue."""
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": f"rayjob-x-{uid[:5]}",
            "namespace": "ml",
            "labels": {"kueue.x-k8s.io/job-uid": uid},
        },
        "spec": {
            "queueName": queue,
            "podSets": [
                {
                    "name": "head",
                    "count": 1,
                    "template": {"spec": {"containers": [{"name": "ray-head", "image": "x"}]}},
                }
            ],
        },
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": WAITING,
                    "lastTransitionTime": "2026-11-25T03:00:00Z",
                }
            ]
        },
    }


def test_a_study_kueue_holds_is_queued_with_kueues_reason(
    kueue_settings, sqlite_db, tmp_path: Path, monkeypatch
) -> None:
    with FakeKubeApi() as api:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path)))
        settings = kueue_settings.model_copy(update={"database_url": sqlite_db.url})
        backend = KubernetesBackend(settings)
        scheduler = Scheduler(sqlite_db, backend, settings)
        ctx = ServiceContext(sqlite_db, settings, scheduler)
        with sqlite_db.session() as s:
            identity.create_project(s, "vision")
            identity.set_quota(s, "vision", quota_gpus=0)  # Kueue's quotas apply, not this
        admin = Principal("admin", admin=True)
        spec = tiny_spec(project="vision", resources={"cpu": 1, "gpu": 1})
        sid = submit_study(ctx, spec, caller=admin)[0].id
        scheduler.tick()
        (ns, name), job = next(iter(api.objects.items()))
        assert job["spec"]["suspend"] is True
        assert job["metadata"]["labels"][KUEUE_QUEUE_LABEL] == "fedtune-vision"
        api.put_workload(_workload(job["metadata"]["uid"], "fedtune-vision"))
        scheduler.tick()
        shown = get_study(ctx, sid)
        assert shown.state == StudyState.QUEUED
        assert shown.queued_reason == f"waiting for Kueue (LocalQueue fedtune-vision): {WAITING}"
        # Kueue admits it (unsuspends), KubeRay starts it
        api.set_spec(ns, name, suspend=False)
        api.set_status(ns, name, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
        scheduler.tick()
        shown = get_study(ctx, sid)
        assert shown.state == StudyState.RUNNING and shown.queued_reason is None
        backend.close()
