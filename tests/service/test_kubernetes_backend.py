"""The kubernetes backend: RayJob manifests against KubeRay's CRD, client calls against a fake
API server reached through a generated kubeconfig."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import jsonschema
import pytest
from kubernetes import config as kube_config

from fedtune.errors import BackendError
from fedtune.service.backends.base import DriverStatus, LaunchRequest
from fedtune.service.backends.k8s_manifest import rayjob_manifest, worker_layout
from fedtune.service.backends.kubernetes import KubernetesBackend, load_api_client, rayjob_status

from ..needs import need
from .k8s_fake import CRD, FakeKubeApi, rayjob_schema


@pytest.fixture(autouse=True)
def _crd_present() -> None:
    need(
        "crds",
        None if CRD.exists() else f"KubeRay CRD {CRD} is not available (set FEDTUNE_CRD_DIR)",
    )


SID = "0123456789ab"
TEMPLATE = {
    "nodeSelector": {"nvidia.com/gpu.present": "true"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "gpu-type", "operator": "In", "values": ["a100"]}
                        ]
                    }
                ]
            }
        }
    },
    "priorityClassName": "batch",
    "runtimeClassName": "nvidia",
}
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


@pytest.fixture
def k8s_settings(make_settings):
    return make_settings(
        backend="kubernetes",
        k8s_namespace="ml",
        k8s_image="registry.example.com/fedtune:0.1.0-cuda",
        k8s_env_secret="demo-fedtune-env",
        k8s_service_account="demo-fedtune-job",
        k8s_worker_template=TEMPLATE,
        k8s_ttl_seconds_after_finished=120,
        k8s_active_deadline_seconds=7200,
    )


def _pods(manifest: dict) -> list[dict]:
    cluster = manifest["spec"]["rayClusterSpec"]
    return [cluster["headGroupSpec"]["template"]] + [
        g["template"] for g in cluster["workerGroupSpecs"]
    ]


# ---------------------------------------------------------------- manifests


@pytest.mark.parametrize(
    ("cpu", "gpu", "concurrent", "layout"),
    [
        (1.0, 0.0, 2, {"replicas": 2, "trials_per_pod": 1, "cpu": 1.0, "gpu": 0}),
        (2.0, 2.0, 3, {"replicas": 3, "trials_per_pod": 1, "cpu": 2.0, "gpu": 2}),
        (0.5, 0.25, 6, {"replicas": 2, "trials_per_pod": 4, "cpu": 2.0, "gpu": 1}),
        (1.0, 0.5, 1, {"replicas": 1, "trials_per_pod": 1, "cpu": 1.0, "gpu": 1}),
    ],
)
def test_manifests_validate_against_the_crd(k8s_settings, cpu, gpu, concurrent, layout) -> None:
    request = LaunchRequest(SID, 2, cpu=cpu, gpu=gpu, max_concurrent=concurrent)
    assert worker_layout(request) == layout
    manifest = rayjob_manifest(request, k8s_settings)
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)

    spec = manifest["spec"]
    assert (
        manifest["metadata"]["name"] == f"fedtune-{SID}-2"
        and manifest["metadata"]["namespace"] == "ml"
    )
    assert shlex.split(spec["entrypoint"]) == [
        "fedtune",
        "worker",
        "run-study",
        SID,
        "--attempt",
        "2",
    ]
    assert spec["shutdownAfterJobFinishes"] is True and spec["backoffLimit"] == 0
    assert spec["ttlSecondsAfterFinished"] == 120 and spec["activeDeadlineSeconds"] == 7200
    head, worker = _pods(manifest)
    group = spec["rayClusterSpec"]["workerGroupSpecs"][0]
    assert group["replicas"] == group["minReplicas"] == group["maxReplicas"] == layout["replicas"]
    limits = worker["spec"]["containers"][0]["resources"]["limits"]
    if gpu:
        assert limits["nvidia.com/gpu"] == str(layout["gpu"])
        assert group["rayStartParams"]["num-gpus"] == str(layout["gpu"])
    else:
        assert "nvidia.com/gpu" not in limits
    for pod in (head, worker):
        container = pod["spec"]["containers"][0]
        assert container["image"] == "registry.example.com/fedtune:0.1.0-cuda"
        assert "envFrom" not in container  # single keys, head only (test_rayjob_hardening.py)
        assert pod["spec"]["serviceAccountName"] == "demo-fedtune-job"
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        labels = pod["metadata"]["labels"]
        assert labels["fedtune.io/study"] == SID
        assert all(len(v) <= 63 and LABEL_VALUE.match(v) for v in labels.values())
    for key, value in TEMPLATE.items():  # workers only: the driver's head stays anywhere
        assert worker["spec"][key] == value and key not in head["spec"]
    assert head["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"


def test_the_strict_schema_catches_a_misspelt_field(k8s_settings) -> None:
    manifest = rayjob_manifest(LaunchRequest(SID, 1), k8s_settings)
    manifest["spec"]["shutdownAfterJobFinish"] = True
    with pytest.raises(jsonschema.ValidationError, match="shutdownAfterJobFinish"):
        jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({}, DriverStatus.PENDING),
        ({"jobDeploymentStatus": "Initializing"}, DriverStatus.PENDING),
        ({"jobDeploymentStatus": "Running", "jobStatus": "PENDING"}, DriverStatus.RUNNING),
        ({"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"}, DriverStatus.RUNNING),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}, DriverStatus.SUCCEEDED),
        ({"jobDeploymentStatus": "Complete", "jobStatus": "FAILED"}, DriverStatus.FAILED),
        ({"jobDeploymentStatus": "Failed", "reason": "DeadlineExceeded"}, DriverStatus.FAILED),
        ({"jobDeploymentStatus": "ValidationFailed"}, DriverStatus.FAILED),
        ({"jobDeploymentStatus": "Running", "jobStatus": "STOPPED"}, DriverStatus.FAILED),
    ],
)
def test_status_mapping(status: dict, expected: DriverStatus) -> None:
    assert rayjob_status({"status": status}) == expected


# ---------------------------------------------------------------- client calls


@pytest.fixture
def cluster(tmp_path: Path):
    with FakeKubeApi() as api:
        api.kubeconfig_path = api.kubeconfig(tmp_path)
        yield api


@pytest.fixture
def k8s(cluster: FakeKubeApi, k8s_settings, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig_path))
    backend = KubernetesBackend(k8s_settings)  # finds the kubeconfig itself
    yield backend
    backend.close()


def test_launch_poll_stop(k8s: KubernetesBackend, cluster: FakeKubeApi) -> None:
    ref = k8s.launch(LaunchRequest(SID, 1, gpu=1.0, max_concurrent=2))
    name = f"fedtune-{SID}-1"
    stored = cluster.objects[("ml", name)]
    assert ref == {"name": name, "namespace": "ml", "uid": stored["metadata"]["uid"]}
    assert stored["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] == 2
    assert k8s.poll(ref) == DriverStatus.PENDING
    cluster.set_status("ml", name, {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING"})
    assert k8s.poll(ref) == DriverStatus.RUNNING
    cluster.set_status("ml", name, {"jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"})
    assert k8s.poll(ref) == DriverStatus.SUCCEEDED
    k8s.stop(ref)
    assert ("ml", name) not in cluster.objects
    assert k8s.poll(ref) == DriverStatus.GONE
    k8s.stop(ref)  # already gone: fine
    verbs = {(verb, path.rsplit("/rayjobs", 1)[0]) for verb, path in cluster.requests}
    assert verbs <= {(v, "/apis/ray.io/v1/namespaces/ml") for v in ("POST", "GET", "DELETE")}


def test_a_retried_launch_adopts_its_own_rayjob(k8s: KubernetesBackend, cluster) -> None:
    first = k8s.launch(LaunchRequest(SID, 1))
    assert k8s.launch(LaunchRequest(SID, 1)) == first  # 409 AlreadyExists → same object
    foreign = rayjob_manifest(LaunchRequest("ba9876543210", 1), k8s.settings)
    foreign["metadata"]["name"] = f"fedtune-{SID}-2"
    assert cluster.handle("POST", "ml", None, foreign)[0] == 201
    with pytest.raises(BackendError, match="not this study's"):
        k8s.launch(LaunchRequest(SID, 2))


def test_a_recreated_object_is_not_ours(k8s: KubernetesBackend, cluster) -> None:
    ref = k8s.launch(LaunchRequest(SID, 1))
    body = cluster.objects.pop(("ml", ref["name"]))
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k in ("name", "labels")}
    cluster.handle("POST", "ml", None, body)  # same name, new uid
    assert k8s.poll(ref) == DriverStatus.GONE
    k8s.stop(ref)  # uid precondition: the new object survives
    assert ("ml", ref["name"]) in cluster.objects


def test_api_server_errors_are_backend_errors(cluster, k8s_settings, tmp_path) -> None:
    wrong = FakeKubeApi(token="other")
    path = wrong.kubeconfig(tmp_path)  # right server, wrong token
    text = path.read_text().replace(wrong.url, cluster.url)
    path.write_text(text)
    client = kube_config.new_client_from_config(config_file=str(path), persist_config=False)
    with pytest.raises(BackendError, match="401"):
        KubernetesBackend(k8s_settings, api_client=client).launch(LaunchRequest(SID, 1))
    wrong.server.server_close()  # nothing listens on its port any more
    closed = wrong.kubeconfig(tmp_path)
    client = kube_config.new_client_from_config(config_file=str(closed), persist_config=False)
    with pytest.raises(BackendError, match="unreachable"):
        KubernetesBackend(k8s_settings, api_client=client).poll({"name": "x", "uid": "y"})


def test_the_fake_refuses_an_invalid_rayjob(cluster: FakeKubeApi, k8s_settings) -> None:
    manifest = rayjob_manifest(LaunchRequest(SID, 1), k8s_settings)
    manifest["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replicas"] = "two"
    code, status = cluster.handle("POST", "ml", None, manifest)
    assert code == 422 and status["reason"] == "Invalid" and "replicas" in status["message"]


def test_no_configuration_is_a_backend_error(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(BackendError, match="no Kubernetes configuration"):
        load_api_client()


def test_workdir_claim_persists_the_study_storage_on_the_head(make_settings) -> None:
    settings = make_settings(
        backend="kubernetes",
        k8s_namespace="ml",
        k8s_image="registry.example.com/fedtune:0.1.0",
        k8s_workdir_claim="fedtune-work",
        workdir="/data/work",
    )
    manifest = rayjob_manifest(LaunchRequest(SID, 3), settings)
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)
    head, worker = _pods(manifest)
    volumes = {v["name"]: v for v in head["spec"]["volumes"]}
    assert volumes["fedtune-workdir"] == {
        "name": "fedtune-workdir",
        "persistentVolumeClaim": {"claimName": "fedtune-work"},
    }
    container = head["spec"]["containers"][0]
    assert {"name": "fedtune-workdir", "mountPath": "/data/work"} in container["volumeMounts"]
    assert {"name": "FEDTUNE_WORKDIR", "value": "/data/work"} in container["env"]
    # trials need no storage; only the driver does
    assert "fedtune-workdir" not in {v["name"] for v in worker["spec"]["volumes"]}
    without = rayjob_manifest(LaunchRequest(SID, 3), make_settings(backend="kubernetes"))
    volumes = {v["name"]: v for v in _pods(without)[0]["spec"]["volumes"]}
    assert volumes["fedtune-workdir"] == {"name": "fedtune-workdir", "emptyDir": {}}


def test_workdir_claim_must_be_a_dns_name(make_settings) -> None:
    from fedtune.errors import ConfigError

    with pytest.raises(ConfigError, match="K8S_WORKDIR_CLAIM"):
        make_settings(backend="kubernetes", k8s_workdir_claim="bad name; rm -rf /")
