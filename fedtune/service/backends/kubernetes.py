"""``kubernetes`` backend: one KubeRay ``RayJob`` per study attempt (``k8s_manifest.py``).

Uses the ``kubernetes`` client's ``CustomObjectsApi`` with in-cluster configuration, or else the
kubeconfig (``KUBECONFIG`` / ``~/.kube/config``). It needs exactly what the Helm chart's Role
grants: create, get, delete on ``rayjobs.ray.io`` in ``FEDTUNE_K8S_NAMESPACE``.

* launch: create the RayJob; a 409 for an object carrying this study's labels (a retried
  launch) adopts it, any other 409 is a ``BackendError``;
* poll: read it and map ``status`` (:func:`rayjob_status`); 404, or an object with another uid
  (deleted and re-created by someone else), is ``GONE``;
* stop: delete it (background propagation: KubeRay tears the RayCluster down); 404 is fine;
* describe: the last polled object's ``status.reason: status.message`` (KubeRay writes e.g.
  ``PreRunningDeadlineExceeded``, ``DeadlineExceeded``, ``SubmissionFailed``, ``AppFailed``),
  which the scheduler records in the study's error;
* exit_info: a failed RayJob's ``status.message`` — KubeRay copies the Ray job's, e.g. "Job
  entrypoint command failed with exit code 127, last available logs ...: /bin/sh: 1: fedtune:
  not found" — gives the driver's exit status and its last error line;
* check: read a RayJob that does not exist (404 is an answer; the Role grants ``get`` only);
  401/403 raise ``BackendAuthError``, a connection error ``BackendUnreachableError``;
* release: KubeRay deletes only the RayCluster of a finished RayJob, never the RayJob object;
  once the job is final and ``ttlSecondsAfterFinished`` has passed since ``status.endTime``
  (the pods' logs stay readable that long), delete it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

from fedtune.errors import BackendError

from ..settings import BackendKind, Settings
from .base import (
    Backend,
    BackendAuthError,
    BackendUnreachableError,
    DriverExit,
    DriverStatus,
    LaunchRequest,
    last_error_line,
)
from .k8s_manifest import GROUP, KUEUE_QUEUE_LABEL, PLURAL, VERSION, rayjob_manifest
from .kueue import workload_reason

__all__ = ["KubernetesBackend", "load_api_client", "rayjob_reason", "rayjob_status"]

log = logging.getLogger(__name__)
TIMEOUT_S = 30
_EXIT_CODE = re.compile(r"exit code (-?\d+)")
#: the name ``check`` reads (no RayJob is ever called so: fedtune's names end in the attempt)
PROBE_NAME = "fedtune-probe"


def rayjob_status(obj: Mapping[str, Any]) -> DriverStatus:
    """Map a RayJob's ``status.jobStatus`` / ``status.jobDeploymentStatus`` to a driver status."""
    status = obj.get("status") or {}
    job, deployment = status.get("jobStatus"), status.get("jobDeploymentStatus")
    if job == "SUCCEEDED":
        return DriverStatus.SUCCEEDED
    if job in ("FAILED", "STOPPED") or deployment in ("Failed", "ValidationFailed"):
        return DriverStatus.FAILED
    if deployment == "Complete":  # finished without a job status: treat as failed
        return DriverStatus.FAILED
    if job == "RUNNING" or deployment == "Running":
        return DriverStatus.RUNNING
    return DriverStatus.PENDING  # New, Initializing, Waiting, Retrying, Suspended, no status


def rayjob_reason(obj: Mapping[str, Any]) -> str | None:
    """``status.reason: status.message`` of a RayJob, in one line (None when both are empty)."""
    status = obj.get("status") or {}
    parts = [str(status[k]).strip() for k in ("reason", "message") if status.get(k)]
    if not parts:
        return None
    name = (obj.get("metadata") or {}).get("name", "?")
    return " ".join(f"RayJob {name}: {': '.join(parts)}".split())[:1000]


def _ended_before(obj: Mapping[str, Any], seconds: int) -> bool:
    end = (obj.get("status") or {}).get("endTime")
    if not end:
        return True
    try:
        ended = dt.datetime.fromisoformat(str(end).replace("Z", "+00:00"))
    except ValueError:
        return True
    return dt.datetime.now(dt.UTC) - ended >= dt.timedelta(seconds=seconds)


def load_api_client() -> Any:
    """An ``ApiClient``: in-cluster service account, else the kubeconfig (``$KUBECONFIG``,
    read at call time, else ``~/.kube/config``)."""
    from kubernetes import client, config

    try:
        configuration = client.Configuration()
        config.load_incluster_config(client_configuration=configuration)
        return client.ApiClient(configuration)
    except config.ConfigException:
        pass
    try:
        return config.new_client_from_config(
            config_file=os.environ.get("KUBECONFIG") or None, persist_config=False
        )
    except (config.ConfigException, OSError) as exc:
        raise BackendError(
            f"no Kubernetes configuration (in-cluster or kubeconfig): {exc}"
        ) from exc


class KubernetesBackend(Backend):
    kind = BackendKind.KUBERNETES
    keeps_finished = True

    def __init__(self, settings: Settings, api_client: Any | None = None) -> None:
        self.settings = settings
        self.namespace = settings.k8s_namespace
        self._api_client = api_client
        self._api: Any = None
        self._seen: dict[str, Mapping[str, Any]] = {}  # last object polled, by name

    def _objects(self) -> Any:
        if self._api is None:
            from kubernetes import client

            self._api_client = self._api_client or load_api_client()
            self._api = client.CustomObjectsApi(self._api_client)
        return self._api

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                *args,
                _request_timeout=(5, TIMEOUT_S),
                **kwargs,
            )
        except ApiException as exc:
            if exc.status in (401, 403):
                raise BackendAuthError(
                    f"Kubernetes API refused the service account ({what}): {exc.status} "
                    f"{exc.reason}"
                ) from exc
            raise
        except Exception as exc:  # urllib3 connection errors, timeouts
            raise BackendUnreachableError(f"Kubernetes API unreachable ({what}): {exc}") from exc

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        uri = None
        if request.code_sha256:  # the study's package, served by the API to its RayJob
            from ..code_url import code_uri

            uri = code_uri(self.settings, request.study_id, request.code_sha256)
        body = rayjob_manifest(request, self.settings, code_uri=uri)
        name = body["metadata"]["name"]
        api = self._objects()
        try:
            created = self._call("create", api.create_namespaced_custom_object, body)
        except ApiException as exc:
            if exc.status != 409:
                raise BackendError(f"creating RayJob {name}: {exc.status} {exc.reason}") from exc
            created = self._get(name)
            labels = (created or {}).get("metadata", {}).get("labels", {})
            if created is None or labels.get("fedtune.io/study") != request.study_id:
                raise BackendError(f"RayJob {name} exists and is not this study's") from exc
        log.info("study %s: RayJob %s created", request.study_id, name)
        uid = created.get("metadata", {}).get("uid")
        return {"name": name, "namespace": self.namespace, "uid": uid}

    def _get(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            return self._call("get", self._objects().get_namespaced_custom_object, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise BackendError(f"reading RayJob {name}: {exc.status} {exc.reason}") from exc

    def _ours(self, ref: Mapping[str, Any]) -> dict[str, Any] | None:
        obj = self._get(str(ref["name"]))
        if obj is None or (ref.get("uid") and obj.get("metadata", {}).get("uid") != ref["uid"]):
            return None
        return obj

    def poll(self, ref: Mapping[str, Any]) -> DriverStatus:
        obj = self._ours(ref)
        if obj is None:
            self._seen.pop(str(ref["name"]), None)
            return DriverStatus.GONE
        self._seen[str(ref["name"])] = obj
        return rayjob_status(obj)

    def describe(self, ref: Mapping[str, Any]) -> str | None:
        obj = self._seen.get(str(ref["name"]))
        return rayjob_reason(obj) if obj is not None else None

    def exit_info(self, ref: Mapping[str, Any]) -> DriverExit:
        """The exit status and last error line in the last polled RayJob's ``status.message``."""
        obj = self._seen.get(str(ref["name"]))
        message = str(((obj or {}).get("status") or {}).get("message") or "")
        found = _EXIT_CODE.search(message)
        return DriverExit(int(found.group(1)) if found else None, last_error_line(message))

    def check(self) -> None:
        self._get(PROBE_NAME)

    def waiting(self, ref: Mapping[str, Any]) -> str | None:
        """A suspended RayJob that Kueue has not admitted: ``waiting for Kueue (LocalQueue q):
        <the Workload's QuotaReserved/Admitted message>`` (Kueue writes why in the Workload it
        makes for the RayJob, labelled ``kueue.x-k8s.io/job-uid``)."""
        obj = self._seen.get(str(ref["name"]))
        if obj is None or not (obj.get("spec") or {}).get("suspend"):
            return None
        queue = (obj.get("metadata", {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL, "?")
        reason = workload_reason(
            self._objects(), self.namespace, obj.get("metadata", {}).get("uid")
        )
        return f"waiting for Kueue (LocalQueue {queue}): {reason or 'not admitted yet'}"

    def release(self, ref: Mapping[str, Any]) -> bool:
        obj = self._ours(ref)
        if obj is None:
            return True
        if rayjob_status(obj).alive:
            return False
        if not _ended_before(obj, self.settings.k8s_ttl_seconds_after_finished):
            return False
        self.stop(ref)
        self._seen.pop(str(ref["name"]), None)
        log.info("RayJob %s deleted (finished)", ref["name"])
        return True

    def stop(self, ref: Mapping[str, Any]) -> None:
        """Delete the RayJob — only the object launched (uid precondition: 409 if replaced)."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        name = str(ref["name"])
        options = client.V1DeleteOptions(
            propagation_policy="Background",
            preconditions=client.V1Preconditions(uid=ref["uid"]) if ref.get("uid") else None,
        )
        try:
            self._call(
                "delete", self._objects().delete_namespaced_custom_object, name, body=options
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise BackendError(f"deleting RayJob {name}: {exc.status} {exc.reason}") from exc

    def close(self) -> None:
        if self._api_client is not None and hasattr(self._api_client, "close"):
            self._api_client.close()
