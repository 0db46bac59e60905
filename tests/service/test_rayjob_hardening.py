"""RayJob manifests as a real KubeRay GPU cluster runs them (and the study code
package it ships): Pod Security "restricted" on every pod of every variant,
secrets only where the driver runs, pull secrets and a pre-running deadline whose reason reaches
the study, memory and /dev/shm from settings, finished RayJobs deleted, rayVersion = the Ray here.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import math

import jsonschema
import pytest
import ray
import yaml

from fedtune.errors import BackendError, ConfigError
from fedtune.service.backends.base import LaunchRequest
from fedtune.service.backends.k8s_manifest import rayjob_manifest
from fedtune.service.backends.k8s_pods import DRIVER_SECRET_KEYS, UID
from fedtune.service.backends.kubernetes import KubernetesBackend
from fedtune.service.mlflow_workspaces import driver_password
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.states import StudyState
from tests.pss_restricted import object_violations, pod_templates

from .helpers import tiny_spec
from .k8s_fake import CRD, FakeKubeApi, rayjob_schema

pytestmark = pytest.mark.skipif(not CRD.exists(), reason=f"KubeRay CRD {CRD} not available")

SID = "0123456789ab"
CODE_URI = "https://fedtune.example.com/api/v1/studies/0123456789ab/code/pkg.zip?token=abc"
TEMPLATE = {"nodeSelector": {"nvidia.com/gpu.present": "true"}, "runtimeClassName": "nvidia"}


def _mi(quantity: str) -> float:
    assert quantity.endswith("Mi"), quantity
    return float(quantity[:-2])


@pytest.fixture
def k8s_settings(make_settings):
    def make(**extra):
        base = dict(
            backend="kubernetes",
            k8s_namespace="ml",
            k8s_image="reg.example.com/fedtune:1",
            k8s_env_secret="demo-fedtune-env",
            k8s_service_account="demo-fedtune-job",
        )
        return make_settings(**(base | extra))

    return make


REQUESTS = [
    LaunchRequest(SID, 1),
    LaunchRequest(SID, 2, cpu=2.0, gpu=2.0, max_concurrent=3),
    LaunchRequest(SID, 3, cpu=0.5, gpu=0.25, max_concurrent=6),
    LaunchRequest(SID, 4, cpu=1.0, gpu=0.5, max_concurrent=1),
]
SETTINGS = [
    {},
    {"k8s_workdir_claim": "fedtune-work", "workdir": "/data/work"},
    {"k8s_image_pull_secrets": "regcred,mirror", "k8s_worker_template": TEMPLATE},
    {"k8s_env_secret": "", "k8s_service_account": "", "k8s_ray_token_auth": False},
]
VARIANTS = list(itertools.product(range(len(REQUESTS)), range(len(SETTINGS)), [None, CODE_URI]))


@pytest.mark.parametrize(("r", "s", "code_uri"), VARIANTS)
def test_every_rayjob_variant_passes_pod_security_restricted(k8s_settings, r, s, code_uri):
    """Finding 6: every pod KubeRay creates for every manifest variant (head, workers, the
    submitter) passes the published Restricted profile, and the manifest fits the CRD."""
    manifest = rayjob_manifest(REQUESTS[r], k8s_settings(**SETTINGS[s]), code_uri=code_uri)
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)
    wheres = [where for where, _, _ in pod_templates(manifest)]
    assert len(wheres) == 3 and wheres[-1].endswith(" submitter")  # explicit, not KubeRay's
    assert object_violations(manifest, "restricted") == []
    for _, _, pod in pod_templates(manifest):
        ctx = pod["securityContext"]
        assert ctx["seccompProfile"] == {"type": "RuntimeDefault"} and ctx["runAsNonRoot"]
        assert ctx["runAsUser"] == ctx["fsGroup"] == UID  # a new PVC is writable by the user
        assert pod["automountServiceAccountToken"] is False


def test_workers_get_no_secret_and_the_driver_only_what_it_reads(k8s_settings):
    """Finding 3: no ``envFrom`` anywhere; the head (driver) gets exactly the driver's keys of
    the env Secret; workers and the submitter get no secret reference at all."""
    manifest = rayjob_manifest(REQUESTS[1], k8s_settings())
    by_role = {where.split(" ", 1)[1]: pod for where, _, pod in pod_templates(manifest)}
    head = by_role.pop("head")["containers"][0]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in head["env"] if "valueFrom" in e}
    assert set(refs) == set(DRIVER_SECRET_KEYS)
    assert all(ref["name"] == "demo-fedtune-env" and ref["key"] == key for key, ref in refs.items())
    assert refs["MLFLOW_TRACKING_URI"].get("optional") is True  # a deployment without MLflow
    assert {e["name"] for e in head["env"]} == {
        *DRIVER_SECRET_KEYS,
        "FEDTUNE_WORKDIR",
        "FEDTUNE_HEARTBEAT_S",
        "HOME",
    }
    for role, pod in by_role.items():
        for container in pod["containers"]:
            assert "envFrom" not in container, role
            assert not any("valueFrom" in e for e in container.get("env", [])), role
    assert "envFrom" not in head


def test_a_driver_that_reaches_the_api_gets_no_database_url(k8s_settings):
    """With FEDTUNE_PUBLIC_URL the head's driver reports through the API: the env Secret's
    database URL is not in the head's environment at all, and neither is a credential: the
    RayJob carries the attempt's one-time start ticket only (readable by whoever reads RayJobs),
    which the driver exchanges for its study's credential and its project's MLflow login."""
    settings = k8s_settings(
        public_url="http://fedtune.ml.svc:8000",
        mlflow_tracking_uri="http://mlflow.ml.svc:5000",
        mlflow_workspaces=True,
        mlflow_admin_password="mlflow-admin-password-0123",
    )
    request = dataclasses.replace(REQUESTS[1], ticket="ftt_the-attempts-ticket")
    manifest = rayjob_manifest(request, settings)
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)  # KubeRay's closed schema
    head = next(pod for where, _, pod in pod_templates(manifest) if where.endswith("head"))
    env = {e["name"]: e for e in head["containers"][0]["env"]}
    assert "FEDTUNE_DATABASE_URL" not in env
    assert env["FEDTUNE_DRIVER_URL"]["value"] == "http://fedtune.ml.svc:8000"
    assert env["FEDTUNE_DRIVER_TICKET"]["value"] == "ftt_the-attempts-ticket"
    assert env["MLFLOW_WORKSPACE"]["value"] == request.project
    for name in ("FEDTUNE_DRIVER_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        assert name not in env
    rendered = json.dumps(manifest)
    assert "mlflow-admin-password" not in rendered
    assert driver_password("mlflow-admin-password-0123", request.project) not in rendered
    assert manifest["spec"]["rayClusterSpec"]["authOptions"] == {"mode": "token"}
    off = rayjob_manifest(REQUESTS[1], k8s_settings(k8s_ray_token_auth=False))
    assert "authOptions" not in off["spec"]["rayClusterSpec"]


def test_image_pull_secrets_on_every_pod_and_a_pre_running_deadline(k8s_settings):
    """Finding 2: pull secrets (a setting) on every pod template, submitter included; a RayJob
    whose pods never run fails after FEDTUNE_K8S_PRE_RUNNING_DEADLINE_SECONDS."""
    settings = k8s_settings(
        k8s_image_pull_secrets="regcred, mirror", k8s_pre_running_deadline_seconds=600
    )
    manifest = rayjob_manifest(REQUESTS[0], settings)
    pods = pod_templates(manifest)
    assert len(pods) == 3
    for where, _, pod in pods:
        assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror"}], where
    assert manifest["spec"]["preRunningDeadlineSeconds"] == 600
    default = rayjob_manifest(REQUESTS[0], k8s_settings())["spec"]
    assert 60 <= default["preRunningDeadlineSeconds"] < default["activeDeadlineSeconds"]
    with pytest.raises(ConfigError, match="K8S_IMAGE_PULL_SECRETS"):
        k8s_settings(k8s_image_pull_secrets="Not_A_Name")


def test_memory_per_trial_and_per_gpu_are_settings_and_shm_is_counted(k8s_settings):
    """Finding 7: worker memory = max(trials × per-trial, GPUs × per-GPU) + /dev/shm; the
    default per GPU is at least 8 GiB; /dev/shm is a memory emptyDir with a sizeLimit."""
    settings = k8s_settings()
    assert settings.k8s_memory_per_gpu_gi >= 8
    whole = rayjob_manifest(REQUESTS[1], settings)  # 2 GPUs per trial
    group = whole["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    container = group["template"]["spec"]["containers"][0]
    memory = _mi(container["resources"]["limits"]["memory"])
    assert (
        container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"]
    )
    expected = 2 * settings.k8s_memory_per_gpu_gi + settings.k8s_shm_gi
    assert memory == math.ceil(expected * 1024) and memory >= 2 * 8 * 1024
    assert "nvidia.com/gpu" not in container["resources"]["requests"]  # limit only
    shm = next(v for v in group["template"]["spec"]["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"] == {
        "medium": "Memory",
        "sizeLimit": f"{math.ceil(settings.k8s_shm_gi * 1024)}Mi",
    }
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    store = int(group["rayStartParams"]["object-store-memory"])
    assert 0 < store < settings.k8s_shm_gi * 2**30  # Ray's object store fits in /dev/shm

    custom = k8s_settings(k8s_memory_per_trial_gi=3, k8s_memory_per_gpu_gi=10, k8s_shm_gi=1)
    packed = rayjob_manifest(REQUESTS[2], custom)  # 4 trials share one GPU per pod
    limits = packed["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"][
        "containers"
    ][0]["resources"]["limits"]
    assert _mi(limits["memory"]) == (max(4 * 3, 1 * 10) + 1) * 1024
    cpu_only = rayjob_manifest(REQUESTS[0], custom)["spec"]["rayClusterSpec"]
    limits = cpu_only["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]
    assert _mi(limits["limits"]["memory"]) == (3 + 1) * 1024
    with pytest.raises(ConfigError, match="K8S_MEMORY_PER_GPU_GI"):
        k8s_settings(k8s_memory_per_gpu_gi=4)


def test_ray_version_is_the_installed_ray(k8s_settings):
    """Finding 13 (code): the RayJob's rayVersion is this Ray, always present."""
    manifest = rayjob_manifest(REQUESTS[0], k8s_settings())
    assert manifest["spec"]["rayClusterSpec"]["rayVersion"] == ray.__version__


def test_code_uri_becomes_the_jobs_py_modules(k8s_settings):
    """The study's code package reaches the driver and trials as py_modules."""
    manifest = rayjob_manifest(REQUESTS[0], k8s_settings(), code_uri=CODE_URI)
    assert yaml.safe_load(manifest["spec"]["runtimeEnvYAML"]) == {"py_modules": [CODE_URI]}
    assert "runtimeEnvYAML" not in rayjob_manifest(REQUESTS[0], k8s_settings())["spec"]
    for bad in ("file:///etc/passwd.zip", "https://x/pkg.tar", "https://x/a b.zip", "pkg.zip"):
        with pytest.raises(BackendError, match="code_uri"):
            rayjob_manifest(REQUESTS[0], k8s_settings(), code_uri=bad)


# ---------------------------------------------------------------- against the fake API server


@pytest.fixture
def world(k8s_settings, sqlite_db, tmp_path, monkeypatch):
    with FakeKubeApi() as api:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path)))
        settings = k8s_settings(
            database_url=sqlite_db.url, k8s_ttl_seconds_after_finished=120, max_dispatch_attempts=1
        )
        backend = KubernetesBackend(settings)
        yield ServiceContext(sqlite_db, settings), backend, api
        backend.close()


def _dispatch(ctx, backend) -> tuple[str, dict]:
    sid = submit_study(ctx, tiny_spec(name="k8s", trials=2, rounds=3))[0].id
    scheduler = Scheduler(ctx.db, backend, ctx.settings)
    assert scheduler.tick().dispatched == [sid]
    with ctx.db.session(readonly=True) as s:
        return sid, dict(Repository(s).require_study(sid).driver_ref)


def test_the_rayjobs_failure_reason_reaches_the_study_error(world):
    """Finding 2: a RayJob stuck in image pull fails at its pre-running deadline; the reason
    KubeRay writes (status.reason/message) is in the study's error, not just 'failed'."""
    ctx, backend, api = world
    sid, ref = _dispatch(ctx, backend)
    message = (
        "RayJob has passed the preRunningDeadlineSeconds; head pod: ImagePullBackOff "
        "(Back-off pulling image reg.example.com/fedtune:1)"
    )
    api.set_status(
        "ml",
        ref["name"],
        {
            "jobDeploymentStatus": "Failed",
            "reason": "PreRunningDeadlineExceeded",
            "message": message,
        },
    )
    Scheduler(ctx.db, backend, ctx.settings).tick()
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.FAILED
    assert "PreRunningDeadlineExceeded" in study.error and "ImagePullBackOff" in study.error
    assert "\n" not in study.error


def test_a_rayjob_whose_command_is_not_found_fails_at_once_with_its_line(world):
    """KubeRay copies the Ray job's message into the RayJob: its exit status (127: permanent)
    fails the study with the first of its attempts, and its last log line is in the error."""
    ctx, backend, api = world
    ctx = ServiceContext(ctx.db, ctx.settings.model_copy(update={"max_dispatch_attempts": 3}))
    sid, ref = _dispatch(ctx, backend)
    message = (
        "Job entrypoint command failed with exit code 127, last available logs (truncated "
        "to 20,000 chars):\n/bin/sh: 1: fedtune: not found\n"
    )
    api.set_status(
        "ml",
        ref["name"],
        {
            "jobDeploymentStatus": "Complete",
            "jobStatus": "FAILED",
            "reason": "AppFailed",
            "message": message,
        },
    )
    Scheduler(ctx.db, backend, ctx.settings).tick()
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert (study.state, study.attempts) == (StudyState.FAILED, 1)
    assert "/bin/sh: 1: fedtune: not found" in study.error and "exit code 127" in study.error
    assert "not retried (command not found)" in study.error and "\n" not in study.error


def test_refused_kubernetes_credentials_mark_the_backend_down(world):
    """A 401 from the API server is an authentication failure of the whole backend, told apart
    from an unreachable API server."""
    from fedtune.service.backend_health import BackendHealth
    from fedtune.service.backends.base import BackendAuthError

    ctx, backend, api = world
    backend.check()  # a RayJob that does not exist: the API answered
    api.token = "another-token"
    with pytest.raises(BackendAuthError, match="401"):
        backend.check()
    health = BackendHealth(backend)
    assert health.probe() is False and health.state.reason.startswith("authentication failed")
    unreachable = KubernetesBackend(ctx.settings, api_client=_api_client_for("127.0.0.1:9"))
    health = BackendHealth(unreachable)
    assert health.probe() is False and health.state.reason.startswith("unreachable")


def _api_client_for(host: str):
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = f"http://{host}"
    configuration.retries = 0
    return client.ApiClient(configuration)


def test_finished_rayjobs_are_deleted_after_their_ttl(world):
    """Finding 12: KubeRay deletes only the RayCluster; the service deletes the RayJob object once
    the study is final and ttlSecondsAfterFinished has passed (logs readable until then)."""
    ctx, backend, api = world
    sid, ref = _dispatch(ctx, backend)
    now = dt.datetime.now(dt.UTC)
    status = {
        "jobDeploymentStatus": "Complete",
        "jobStatus": "SUCCEEDED",
        "endTime": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    api.set_status("ml", ref["name"], status)
    with ctx.db.session() as s:  # the driver wrote its final state
        Repository(s).transition(sid, StudyState.SUCCEEDED, expected=[StudyState.RUNNING])
    scheduler = Scheduler(ctx.db, backend, ctx.settings)
    assert scheduler.tick().released == []  # within the TTL: kept
    assert ("ml", ref["name"]) in api.objects
    old = (now - dt.timedelta(seconds=121)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api.set_status("ml", ref["name"], {**status, "endTime": old})
    assert scheduler.tick().released == [sid]
    assert ("ml", ref["name"]) not in api.objects
    with ctx.db.session(readonly=True) as s:
        assert Repository(s).require_study(sid).driver_ref is None
    assert scheduler.tick().released == []  # nothing left to release


def test_a_requeued_studys_old_rayjob_is_deleted(world):
    """Finding 12: a failed attempt that is re-dispatched does not leave its RayJob behind."""
    ctx, backend, api = world
    settings = ctx.settings.model_copy(update={"max_dispatch_attempts": 3})
    sid, ref = _dispatch(ServiceContext(ctx.db, settings), backend)
    api.set_status("ml", ref["name"], {"jobDeploymentStatus": "Failed", "reason": "AppFailed"})
    report = Scheduler(ctx.db, backend, settings).tick()
    assert [r.action for r in report.recovered] == ["requeued"] and report.dispatched == [sid]
    assert ("ml", ref["name"]) not in api.objects
    assert ("ml", f"fedtune-{sid}-2") in api.objects
