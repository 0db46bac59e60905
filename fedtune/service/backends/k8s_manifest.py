"""The KubeRay ``RayJob`` (``ray.io/v1``) that runs one study attempt on Kubernetes.

    RayJob fedtune-<study>-<attempt>
      entrypoint               fedtune worker run-study <study> --attempt <n>   (runs on the head)
      shutdownAfterJobFinishes true    the RayCluster goes away when the driver exits
      ttlSecondsAfterFinished  FEDTUNE_K8S_TTL_SECONDS_AFTER_FINISHED, then the RayJob too
      activeDeadlineSeconds    FEDTUNE_K8S_ACTIVE_DEADLINE_SECONDS, a study's wall-clock limit
      backoffLimit 0           re-dispatch is the scheduler's job (it resumes, KubeRay would not)
      head group               num-cpus 0: the driver only, no trial lands on the head
      worker group "trials"    replicas = pods needed for budget.max_concurrent trials at once

Sizing from the study's ``resources`` (per trial ``cpu``, ``gpu``): a whole-GPU trial gets a pod
with ``nvidia.com/gpu: ceil(gpu)``; fractional GPUs (gpu < 1) pack ⌊1/gpu⌋ trials per one-GPU
pod; CPU trials get one pod each. Every pod gets the image ``FEDTUNE_K8S_IMAGE``, ``envFrom`` the
Secret ``FEDTUNE_K8S_ENV_SECRET`` (database and MLflow URLs), the ServiceAccount
``FEDTUNE_K8S_SERVICE_ACCOUNT``, no mounted API token and a restricted security context; worker
pods also get ``FEDTUNE_K8S_WORKER_TEMPLATE`` (nodeSelector, tolerations, affinity,
priorityClassName, runtimeClassName). With ``FEDTUNE_K8S_WORKDIR_CLAIM`` the head pod (where the
driver runs) mounts that PVC at ``FEDTUNE_WORKDIR``, so a re-dispatched attempt finds the study's
Optuna storage and resumes instead of starting over. Every value here is validated (settings) or generated
(study id, numbers): no spec string reaches the manifest or the entrypoint.
"""

from __future__ import annotations

import copy
import importlib.metadata
import math
import shlex
from typing import Any

from ..settings import Settings
from .base import LaunchRequest, check_study_id, driver_argv

__all__ = ["GROUP", "PLURAL", "VERSION", "rayjob_manifest", "rayjob_name", "worker_layout"]

GROUP, VERSION, PLURAL = "ray.io", "v1", "rayjobs"
MEMORY_PER_TRIAL_GI = 2
HEAD_MEMORY_GI = 2


def rayjob_name(study_id: str, attempt: int) -> str:
    return f"fedtune-{check_study_id(study_id)}-{int(attempt)}"


def worker_layout(request: LaunchRequest) -> dict[str, int | float]:
    """Pods, trials per pod, CPUs and GPUs per pod for ``request``."""
    gpu = request.gpu
    per_pod = max(1, math.floor(1 / gpu)) if 0 < gpu < 1 else 1
    per_pod = min(per_pod, request.max_concurrent)
    return {
        "replicas": math.ceil(request.max_concurrent / per_pod),
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


def _container(name: str, settings: Settings, resources: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": name,
        "image": settings.k8s_image,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "FEDTUNE_HEARTBEAT_S", "value": str(settings.heartbeat_s)}],
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if settings.k8s_env_secret:
        container["envFrom"] = [{"secretRef": {"name": settings.k8s_env_secret}}]
    return container


def _pod(labels: dict[str, str], settings: Settings, container: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {"automountServiceAccountToken": False, "containers": [container]}
    if settings.k8s_service_account:
        spec["serviceAccountName"] = settings.k8s_service_account
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def _head_pod(labels: dict[str, str], settings: Settings, resources: dict[str, Any]) -> dict:
    container = _container("ray-head", settings, resources)
    pod = _pod(labels, settings, container)
    if settings.k8s_workdir_claim:
        workdir = str(settings.workdir)
        container["env"].append({"name": "FEDTUNE_WORKDIR", "value": workdir})
        container["volumeMounts"] = [{"name": "fedtune-workdir", "mountPath": workdir}]
        pod["spec"]["volumes"] = [
            {"name": "fedtune-workdir",
             "persistentVolumeClaim": {"claimName": settings.k8s_workdir_claim}}
        ]  # fmt: skip
    return pod


def _ray_version() -> str | None:
    try:
        return importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        return None


def rayjob_manifest(request: LaunchRequest, settings: Settings) -> dict[str, Any]:
    """The RayJob object to create for ``request`` (see the module docstring)."""
    labels = _labels(request)
    layout = worker_layout(request)
    head_res = {
        "requests": {"cpu": "1", "memory": f"{HEAD_MEMORY_GI}Gi"},
        "limits": {"memory": f"{HEAD_MEMORY_GI * 2}Gi"},
    }
    memory = f"{MEMORY_PER_TRIAL_GI * layout['trials_per_pod']}Gi"
    limits: dict[str, Any] = {"cpu": _quantity(layout["cpu"]), "memory": memory}
    worker_params = {"num-cpus": str(math.ceil(layout["cpu"]))}
    if layout["gpu"]:
        limits["nvidia.com/gpu"] = str(layout["gpu"])
        worker_params["num-gpus"] = str(layout["gpu"])
    worker_res = {"requests": {"cpu": _quantity(layout["cpu"]), "memory": memory}, "limits": limits}
    worker_pod = _pod(labels, settings, _container("ray-worker", settings, worker_res))
    worker_pod["spec"].update(copy.deepcopy(settings.k8s_worker_template))
    cluster: dict[str, Any] = {
        "headGroupSpec": {
            "rayStartParams": {"num-cpus": "0"},
            "template": _head_pod(labels, settings, head_res),
        },
        "workerGroupSpecs": [
            {
                "groupName": "trials",
                "replicas": layout["replicas"],
                "minReplicas": layout["replicas"],
                "maxReplicas": layout["replicas"],
                "rayStartParams": worker_params,
                "template": worker_pod,
            }
        ],
    }
    version = _ray_version()
    if version:
        cluster["rayVersion"] = version
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "RayJob",
        "metadata": {
            "name": rayjob_name(request.study_id, request.attempt),
            "namespace": settings.k8s_namespace,
            "labels": labels,
        },
        "spec": {
            "entrypoint": shlex.join(driver_argv(request.study_id, request.attempt)),
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": settings.k8s_ttl_seconds_after_finished,
            "activeDeadlineSeconds": settings.k8s_active_deadline_seconds,
            "backoffLimit": 0,
            "rayClusterSpec": cluster,
        },
    }
