"""Pod templates of a study's RayJob: head (the driver), Ray workers (the trials), submitter.

Every pod passes Pod Security "restricted" (checked by ``tests/pss_restricted.py``):

    pod        runAsNonRoot, runAsUser/runAsGroup/fsGroup 10001 (a new PVC is writable by the
               image's user), seccompProfile RuntimeDefault, no API token, imagePullSecrets
    container  allowPrivilegeEscalation false, capabilities drop ALL, read-only root file system
    volumes    /tmp (emptyDir: Ray's session dir), /dev/shm (emptyDir medium Memory with a
               sizeLimit, charged to the pod's memory), the head's workdir (PVC or emptyDir)

What each pod may read (finding "secrets reach every Ray pod"): the **head** runs the driver and
gets exactly the variables the driver reads — ``FEDTUNE_DATABASE_URL`` and
``MLFLOW_TRACKING_URI`` (single keys of the env Secret, never ``envFrom``), ``FEDTUNE_WORKDIR``,
``FEDTUNE_HEARTBEAT_S``, with MLflow workspaces its project's ``MLFLOW_WORKSPACE``, and, where
it reports to the API, its one-time start ticket instead of the database URL (the driver
exchanges it for its credentials: ``fedtune.service.tickets``); **workers** run trials, which
never open the database or MLflow, and get
no secret at all; the **submitter** only runs ``ray job submit`` (KubeRay adds the head's address
and, with token auth, the Ray token).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from ..settings import Settings

__all__ = [
    "DRIVER_SECRET_KEYS",
    "UID",
    "gib",
    "head_pod",
    "object_store_bytes",
    "submitter_pod",
    "worker_pod",
]

UID = 10001  # the image's user (Dockerfile)
#: keys of the env Secret the driver reads; optional ones may be absent from the Secret
DRIVER_SECRET_KEYS = {"FEDTUNE_DATABASE_URL": False, "MLFLOW_TRACKING_URI": True}
HEAD_WORKDIR = "/data"  # the driver's workdir on the head when FEDTUNE_WORKDIR is relative
OBJECT_STORE_SHARE = 0.8  # of /dev/shm given to Ray's object store (the rest: headroom)


def gib(value: float) -> str:
    """A memory quantity in whole MiB (Kubernetes accepts no fractional Gi)."""
    return f"{math.ceil(value * 1024)}Mi"


def object_store_bytes(settings: Settings) -> int:
    return int(settings.k8s_shm_gi * OBJECT_STORE_SHARE * 2**30)


def head_workdir(settings: Settings) -> str:
    return str(settings.workdir) if settings.workdir.is_absolute() else HEAD_WORKDIR


def _security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": UID,
        "runAsGroup": UID,
        "fsGroup": UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container(name: str, settings: Settings, resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "image": settings.k8s_image,
        "imagePullPolicy": "IfNotPresent",
        "env": [{"name": "HOME", "value": "/tmp"}],
        "resources": resources,
        "securityContext": _security(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }


def _pod(labels: dict[str, str], settings: Settings, container: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    if settings.k8s_service_account:
        spec["serviceAccountName"] = settings.k8s_service_account
    if settings.k8s_image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in settings.k8s_image_pull_secrets]
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def _with_shm(pod: dict[str, Any], settings: Settings) -> dict[str, Any]:
    pod["spec"]["volumes"].append(
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": gib(settings.k8s_shm_gi)}}
    )
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "dshm", "mountPath": "/dev/shm"})
    return pod


def _secret_env(settings: Settings) -> list[dict[str, Any]]:
    """The env Secret's keys the driver reads: not the database URL when it reports to the
    service's API instead (``FEDTUNE_PUBLIC_URL``, ``service.driver_link``)."""
    if not settings.k8s_env_secret:
        return []
    keys = {
        key: optional
        for key, optional in DRIVER_SECRET_KEYS.items()
        if not (key == "FEDTUNE_DATABASE_URL" and settings.drivers_report_to)
    }
    return [
        {
            "name": key,
            "valueFrom": {
                "secretKeyRef": {
                    "name": settings.k8s_env_secret,
                    "key": key,
                    **({"optional": True} if opt else {}),
                }
            },
        }
        for key, opt in keys.items()
    ]


def head_pod(
    labels: dict[str, str],
    settings: Settings,
    resources: dict[str, Any],
    env: Mapping[str, str] | None = None,
) -> dict:
    """The head: Ray's GCS and the study driver (the RayJob's entrypoint).

    Args:
        labels: The pod's labels.
        settings: The service's settings.
        resources: The container's resources.
        env: The driver's variables (``child_env``'s ``rayjob``: heartbeat, its project's
            MLflow workspace, the URL it reports to and its one-time start ticket).

    Returns:
        The pod template.
    """
    container = _container("ray-head", settings, resources)
    workdir = head_workdir(settings)
    container["env"] += [
        {"name": "FEDTUNE_WORKDIR", "value": workdir},
        *_secret_env(settings),
        *({"name": k, "value": v} for k, v in (env or {}).items()),
    ]
    container["volumeMounts"].append({"name": "fedtune-workdir", "mountPath": workdir})
    pod = _with_shm(_pod(labels, settings, container), settings)
    source: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": settings.k8s_workdir_claim}}
        if settings.k8s_workdir_claim
        else {"emptyDir": {}}
    )
    pod["spec"]["volumes"].append({"name": "fedtune-workdir", **source})
    return pod


def worker_pod(labels: dict[str, str], settings: Settings, resources: dict[str, Any]) -> dict:
    """A Ray worker: trials only; no secret, the operator's worker template applied."""
    pod = _with_shm(_pod(labels, settings, _container("ray-worker", settings, resources)), settings)
    pod["spec"].update(copy.deepcopy(settings.k8s_worker_template))
    return pod


SUBMITTER_RESOURCES = {
    "requests": {"cpu": "200m", "memory": "512Mi"},
    "limits": {"memory": "1Gi"},
}


def submitter_pod(labels: dict[str, str], settings: Settings) -> dict[str, Any]:
    """KubeRay's submitter Job pod (``ray job submit``), hardened like the others. KubeRay fills
    in the command and ``RAY_DASHBOARD_ADDRESS``/``RAY_JOB_SUBMISSION_ID``."""
    container = _container("ray-job-submitter", settings, copy.deepcopy(SUBMITTER_RESOURCES))
    pod = _pod(labels, settings, container)
    pod["spec"]["restartPolicy"] = "Never"
    return pod
