"""The KubeRay ``RayJob`` (``ray.io/v1``) that runs one study attempt on Kubernetes.

    RayJob fedtune-<study>-<attempt>
      entrypoint                 fedtune worker run-study <study> --attempt <n>   (on the head)
      runtimeEnvYAML             py_modules: [code_uri]   only with a study code package
      shutdownAfterJobFinishes   true: KubeRay deletes the RayCluster (the pods)
      ttlSecondsAfterFinished    FEDTUNE_K8S_TTL_SECONDS_AFTER_FINISHED after the job finished
      activeDeadlineSeconds      FEDTUNE_K8S_ACTIVE_DEADLINE_SECONDS, a study's wall-clock limit
      preRunningDeadlineSeconds  FEDTUNE_K8S_PRE_RUNNING_DEADLINE_SECONDS: a job whose pods never
                                 run (image pull errors, unschedulable) fails with
                                 PreRunningDeadlineExceeded instead of waiting for the above
      backoffLimit 0             re-dispatch is the scheduler's job (it resumes, KubeRay would not)
      submitterPodTemplate       a hardened submitter (KubeRay's default one has no securityContext)
      rayClusterSpec
        rayVersion               the Ray installed here (the image's: one lock file builds both)
        authOptions.mode token   with FEDTUNE_K8S_RAY_TOKEN_AUTH (KubeRay >= 1.5 makes the token)
        head group               num-cpus 0: the driver only, no trial lands on the head
        worker group "trials"    replicas = pods needed for the trial processes at once

The RayJob object itself is *not* deleted by KubeRay (``shutdownAfterJobFinishes`` removes only
the RayCluster; the ``deletionStrategy`` field needs an alpha feature gate): the service deletes
it once the study's driver is final (``KubernetesBackend.release``, called by the scheduler).

Sizing from the study's ``resources`` (per trial process ``cpu``, ``gpu``) and its trial
processes at once (``LaunchRequest.processes``: ``budget.max_concurrent``, or
``ceil(max_concurrent / P)`` for a study packing P configurations per process,
:func:`fedtune.tuning.packing.plan.reserved_processes`): a whole-GPU process gets a pod with
``nvidia.com/gpu: ceil(gpu)`` (a limit only: Kubernetes sets the request equal); fractional GPUs
(gpu < 1) put ⌊1/gpu⌋ processes on one one-GPU pod; CPU processes get one pod each. Worker
memory is ``max(processes × FEDTUNE_K8S_MEMORY_PER_TRIAL_GI, GPUs × FEDTUNE_K8S_MEMORY_PER_GPU_GI)
+ FEDTUNE_K8S_SHM_GI`` (``/dev/shm`` is memory-backed and counts against the limit); Ray's object
store is sized to fit in ``/dev/shm``. Pod templates, their security contexts and which
variables each pod gets: ``k8s_pods.py``. Every value here is validated (settings) or generated
(study id, numbers): no spec string reaches the manifest or the entrypoint.
"""

from __future__ import annotations

import importlib.metadata
import math
import shlex
from typing import Any
from urllib.parse import urlsplit

import yaml

from fedtune.errors import BackendError

from ..child_env import ChildKind, child_env
from ..settings import Settings
from .base import LaunchRequest, check_study_id, driver_argv
from .k8s_pods import gib, head_pod, object_store_bytes, submitter_pod, worker_pod

__all__ = [
    "GROUP",
    "KUEUE_QUEUE_LABEL",
    "PLURAL",
    "VERSION",
    "kueue_queue",
    "ray_version",
    "rayjob_manifest",
    "rayjob_name",
    "runtime_env_yaml",
    "worker_layout",
]

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
HEAD_MEMORY_GI = 2


def rayjob_name(study_id: str, attempt: int) -> str:
    return f"fedtune-{check_study_id(study_id)}-{int(attempt)}"


def worker_layout(request: LaunchRequest) -> dict[str, int | float]:
    """Lay out the worker pods for ``request``'s trial processes (see the module docstring).

    Args:
        request: The dispatch, its ``processes`` each holding ``cpu`` and ``gpu``.

    Returns:
        ``replicas`` (pods), ``trials_per_pod`` (trial processes per pod), and the ``cpu`` and
        ``gpu`` of one pod.
    """
    gpu = request.gpu
    per_pod = max(1, math.floor(1 / gpu)) if 0 < gpu < 1 else 1
    per_pod = min(per_pod, request.processes)
    return {
        "replicas": math.ceil(request.processes / per_pod),
        "trials_per_pod": per_pod,
        "cpu": request.cpu * per_pod,
        "gpu": 0 if gpu == 0 else max(1, math.ceil(gpu)),
    }


def _labels(request: LaunchRequest) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "fedtune",
        "app.kubernetes.io/component": "study",
        "app.kubernetes.io/managed-by": "fedtune",
        "fedtune.io/study": request.study_id,
        "fedtune.io/attempt": str(request.attempt),
    }


def _quantity(cpu: float) -> str:
    milli = math.ceil(cpu * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def ray_version() -> str:
    """The installed Ray's version (the image's): RayJob pods must run exactly this Ray."""
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        raise BackendError("Ray is not installed: cannot set the RayJob's rayVersion") from None


def runtime_env_yaml(code_uri: str) -> str:
    """``runtimeEnvYAML`` that ships the study's code package (a ``.zip`` or ``.whl`` URL)."""
    parts = urlsplit(code_uri)
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or any(ch.isspace() for ch in code_uri)
    ):
        raise BackendError(f"code_uri must be an http(s) URL, not {code_uri!r}")
    if not parts.path.endswith((".zip", ".whl")):
        raise BackendError("code_uri must name a .zip or .whl (Ray's remote py_modules)")
    return yaml.safe_dump({"py_modules": [code_uri]}, sort_keys=False)


def _worker_group(request: LaunchRequest, settings: Settings, labels: dict) -> dict[str, Any]:
    layout = worker_layout(request)
    memory = (
        max(
            layout["trials_per_pod"] * settings.k8s_memory_per_trial_gi,
            layout["gpu"] * settings.k8s_memory_per_gpu_gi,
        )
        + settings.k8s_shm_gi
    )
    cpu = _quantity(layout["cpu"])
    limits: dict[str, Any] = {"cpu": cpu, "memory": gib(memory)}
    params = {
        "num-cpus": str(math.ceil(layout["cpu"])),
        "object-store-memory": str(object_store_bytes(settings)),
    }
    if layout["gpu"]:
        limits["nvidia.com/gpu"] = str(layout["gpu"])
        params["num-gpus"] = str(layout["gpu"])
    resources = {"requests": {"cpu": cpu, "memory": gib(memory)}, "limits": limits}
    return {
        "groupName": "trials",
        "replicas": layout["replicas"],
        "minReplicas": layout["replicas"],
        "maxReplicas": layout["replicas"],
        "rayStartParams": params,
        "template": worker_pod(labels, settings, resources),
    }


def _cluster(request: LaunchRequest, settings: Settings, labels: dict) -> dict[str, Any]:
    head_memory = HEAD_MEMORY_GI + settings.k8s_shm_gi
    head_res = {
        "requests": {"cpu": "1", "memory": gib(head_memory)},
        "limits": {"memory": gib(head_memory + HEAD_MEMORY_GI)},
    }
    head_params = {"num-cpus": "0", "object-store-memory": str(object_store_bytes(settings))}
    cluster: dict[str, Any] = {
        "rayVersion": ray_version(),
        "headGroupSpec": {
            "rayStartParams": head_params,
            "template": head_pod(
                labels,
                settings,
                head_res,
                child_env(
                    settings,
                    ChildKind.RAYJOB,
                    project=request.project,
                    ticket=request.ticket,
                ),
            ),
        },
        "workerGroupSpecs": [_worker_group(request, settings, labels)],
    }
    if settings.k8s_ray_token_auth:
        cluster["authOptions"] = {"mode": "token"}
    return cluster


def rayjob_manifest(
    request: LaunchRequest, settings: Settings, *, code_uri: str | None = None
) -> dict[str, Any]:
    """The RayJob object to create for ``request`` (see the module docstring).

    ``code_uri``: where the service serves this study's code package (with its per-study
    credential); rendered as the job's ``py_modules``, so the driver and every trial import it.
    """
    labels = _labels(request)
    spec: dict[str, Any] = {
        "entrypoint": shlex.join(driver_argv(request.study_id, request.attempt)),
        "submissionMode": "K8sJobMode",
        "shutdownAfterJobFinishes": True,
        "ttlSecondsAfterFinished": settings.k8s_ttl_seconds_after_finished,
        "activeDeadlineSeconds": settings.k8s_active_deadline_seconds,
        "preRunningDeadlineSeconds": settings.k8s_pre_running_deadline_seconds,
        "backoffLimit": 0,
        "rayClusterSpec": _cluster(request, settings, labels),
        "submitterPodTemplate": submitter_pod(labels, settings),
    }
    if code_uri is not None:
        spec["runtimeEnvYAML"] = runtime_env_yaml(code_uri)
    metadata_labels = dict(labels)
    if settings.k8s_kueue:  # Kueue admits it: created suspended, in the project's LocalQueue
        metadata_labels[KUEUE_QUEUE_LABEL] = kueue_queue(request, settings)
        spec["suspend"] = True
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayJob",
        "metadata": {
            "name": rayjob_name(request.study_id, request.attempt),
            "namespace": settings.k8s_namespace,
            "labels": metadata_labels,
        },
        "spec": spec,
    }


#: the label by which a RayJob joins a Kueue LocalQueue (Kueue's RayJob integration)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


def kueue_queue(request: LaunchRequest, settings: Settings) -> str:
    """The LocalQueue of the study's project: the project's ``queue_name``, else the prefix
    (``FEDTUNE_K8S_KUEUE_QUEUE_PREFIX``, default ``fedtune-``) and the project's name."""
    return request.queue or f"{settings.k8s_kueue_queue_prefix}{request.project}"
