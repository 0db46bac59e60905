"""``ray`` backend: the driver is a job submitted with the Ray Jobs API to ``RAY_ADDRESS``.

One job per dispatch attempt, ``submission_id = fedtune-<study id>-<attempt>`` (the reference),
entrypoint ``fedtune worker run-study <id> --attempt <n>`` (built with ``shlex.join`` from
validated parts: Ray runs entrypoints through a shell). Inside the job Ray sets ``RAY_ADDRESS``,
so the driver's trials run on that cluster.

The job's ``runtime_env`` carries the driver's own settings (:func:`..child_env.child_env`, kind
``ray-job``): the URL it reports to (``FEDTUNE_DRIVER_URL`` or ``FEDTUNE_PUBLIC_URL``), its
one-time start ticket (``FEDTUNE_DRIVER_TICKET``: :mod:`..tickets`) and its project's MLflow
workspace; never a credential, the database URL or a service secret: anything on the cluster can
list the jobs with their ``runtime_env`` (Ray's job API, ``ray.util.state``, the dashboard).
The driver exchanges the ticket, once, for its study's credential and its project's MLflow
login; a second redemption marks the attempt compromised. Without such a URL the cluster's
processes must carry ``FEDTUNE_DATABASE_URL`` themselves (and the job the MLflow login). ``MLFLOW_TRACKING_URI`` comes
from the cluster's environment (the Helm chart's RayCluster head reads that one key of the env
Secret); without it each driver writes MLflow to a SQLite file in the *head's* workdir, which the
service cannot read unless it shares that workdir: the backend warns at start.

A study with uploaded code: the driver fetches the package through its link and unpacks it under
the head's ``FEDTUNE_WORKDIR/code/<sha256>`` (:mod:`fedtune.service.study_code`), then, asked by
the job's ``FEDTUNE_DRIVER_SANDBOX``, runs the rest of itself in a sandbox on the head
(:mod:`fedtune.service.head_sandbox`); its ``ray.init`` ships the package to the trials on every
node as ``runtime_env`` ``py_modules`` (:mod:`fedtune.tuning.driver.code_shipping`; Ray merges that
with the job's own ``runtime_env``).

A cluster with token authentication (Ray turns it on when a token exists) needs its token in
``RAY_AUTH_TOKEN`` (Ray's own variable, read by the settings); it is sent as
``Authorization: Bearer`` on every Jobs API call, independently of Ray's in-process auth state.

Cluster capacity (:meth:`RayJobsBackend.capacity_gpus`): the ``GPU`` totals of the ALIVE nodes,
read from the dashboard's state API (``GET /api/v0/nodes``) at most every ``CAPACITY_TTL_S``; the
service's admission uses it when ``FEDTUNE_CLUSTER_GPUS`` is not set (an autoscaling cluster's
capacity follows its nodes).

Status mapping: PENDING → pending, RUNNING → running, SUCCEEDED → succeeded, FAILED/STOPPED →
failed, 404 → gone; an unreachable dashboard raises ``BackendUnreachableError`` and refused
credentials (HTTP 401: no token, 403: a wrong one) ``BackendAuthError`` — the backend is down,
whatever the study (:mod:`fedtune.service.backend_health`; ``check`` probes ``/api/version``,
which token authentication guards as it does the Jobs API).

A failed job's ending (:meth:`RayJobsBackend.exit_info`): the driver's exit status
(``driver_exit_code`` of the job's info) and the last error line of the job's log
(``get_job_logs``: what the entrypoint wrote, e.g. ``/bin/sh: 1: fedtune: not found``).
"""

from __future__ import annotations

import logging
import re
import shlex
import time
from collections.abc import Callable, Mapping
from typing import Any

from fedtune.errors import BackendError

from ..child_env import ChildKind, child_env
from ..settings import BackendKind, Settings
from .base import (
    Backend,
    BackendAuthError,
    BackendUnreachableError,
    DriverExit,
    DriverStatus,
    LaunchRequest,
    driver_argv,
    last_error_line,
)

__all__ = ["RayJobsBackend", "submission_id"]

log = logging.getLogger(__name__)

#: how long a read of the cluster's GPUs is reused (the scheduler asks every tick)
CAPACITY_TTL_S = 30.0

_STATUS = {
    "PENDING": DriverStatus.PENDING,
    "RUNNING": DriverStatus.RUNNING,
    "SUCCEEDED": DriverStatus.SUCCEEDED,
    "FAILED": DriverStatus.FAILED,
    "STOPPED": DriverStatus.FAILED,
}


#: how much of a failed job's log is searched for its last error line
LOG_TAIL_CHARS = 64_000
_EXIT_CODE = re.compile(r"exit code (-?\d+)")


def submission_id(study_id: str, attempt: int) -> str:
    return f"fedtune-{study_id}-{attempt}"


def _unusable(what: str, exc: BaseException) -> BackendError | None:
    """``BackendAuthError``/``BackendUnreachableError`` for an error that says the Jobs API
    refused the credentials or did not answer, in one line; None for any other error."""
    text = str(exc)
    first = (text.strip().splitlines() or [type(exc).__name__])[0]
    auth = type(exc).__name__ == "AuthenticationError" or any(
        m in text for m in ("Authentication required", "Authentication failed")
    )
    if auth:
        return BackendAuthError(f"{what}: {first}")
    if isinstance(exc, (ConnectionError, TimeoutError)) or type(exc).__module__.startswith(
        ("requests", "urllib3", "httpx", "httpcore")
    ):
        return BackendUnreachableError(f"{what}: {first}")
    return None


class RayJobsBackend(Backend):
    kind = BackendKind.RAY

    def __init__(
        self,
        settings: Settings,
        client_factory: Callable[[str], Any] | None = None,
        *,
        argv: Callable[[str, int], list[str]] = driver_argv,
    ) -> None:
        if not settings.ray_address:
            raise BackendError("backend 'ray' needs RAY_ADDRESS (the dashboard, http://host:8265)")
        self.address = settings.ray_address
        self.settings = settings
        if not settings.mlflow_tracking_uri:
            log.warning(
                "backend 'ray' without MLFLOW_TRACKING_URI: each driver logs to a SQLite store in "
                "the Ray head's FEDTUNE_WORKDIR, which this service reads only if it shares that "
                "workdir (MLflow ids and trade-offs); give the service and the cluster one "
                "tracking URI"
            )
        self._factory = client_factory
        self._argv = argv
        self._client: Any = None
        self._capacity: tuple[float, float | None] | None = None  # (read at, GPUs)

    def _headers(self) -> dict[str, str] | None:
        token = self.settings.ray_auth_token
        return {"Authorization": f"Bearer {token.get_secret_value()}"} if token else None

    def _jobs(self) -> Any:
        if self._client is None:
            factory = self._factory
            if factory is None:
                from ray.job_submission import JobSubmissionClient

                headers = self._headers()

                def factory(address: str) -> Any:
                    return JobSubmissionClient(address, headers=headers)

            try:
                self._client = factory(self.address)
            except Exception as exc:  # requests.ConnectionError, AuthenticationError, ...
                what = f"Ray Jobs API at {self.address}"
                raise _unusable(what, exc) or BackendError(f"{what}: {exc}") from exc
        return self._client

    def check(self) -> None:
        """``GET /api/version`` with the token: 401/403 → ``BackendAuthError``, no answer →
        ``BackendUnreachableError``, another error status → ``BackendError``."""
        import httpx

        url = f"{self.address.rstrip('/')}/api/version"
        try:
            reply = httpx.get(url, headers=self._headers(), timeout=5.0)
        except httpx.HTTPError as exc:
            raise BackendUnreachableError(f"Ray Jobs API at {self.address}: {exc}") from exc
        if reply.status_code in (401, 403):
            token = (
                "RAY_AUTH_TOKEN refused"
                if self.settings.ray_auth_token
                else ("the cluster requires a token and RAY_AUTH_TOKEN is not set")
            )
            raise BackendAuthError(
                f"Ray Jobs API at {self.address} answered {reply.status_code} ({token})"
            )
        if reply.status_code >= 400:
            raise BackendError(f"Ray Jobs API at {self.address} answered {reply.status_code}")

    def exit_info(self, ref: Mapping[str, Any]) -> DriverExit:
        """The job's ``driver_exit_code`` and the last error line of its log (else of its
        status message)."""
        sid = str(ref["submission_id"])
        try:
            info = self._jobs().get_job_info(sid)
            logs = self._jobs().get_job_logs(sid)
        except BackendError:
            raise
        except Exception as exc:
            self._client = None
            raise _unusable(f"Ray job {sid}", exc) or BackendError(f"Ray job {sid}: {exc}") from exc
        message = str(getattr(info, "message", None) or "")
        code = getattr(info, "driver_exit_code", None)
        if code is None and (found := _EXIT_CODE.search(message)):
            code = int(found.group(1))
        line = last_error_line(str(logs or "")[-LOG_TAIL_CHARS:]) or last_error_line(message)
        return DriverExit(code, line)

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        sid = submission_id(request.study_id, request.attempt)
        entrypoint = shlex.join(self._argv(request.study_id, request.attempt))
        try:
            self._jobs().submit_job(
                entrypoint=entrypoint,
                submission_id=sid,
                runtime_env={
                    "env_vars": child_env(
                        self.settings,
                        ChildKind.RAY_JOB,
                        project=request.project,
                        ticket=request.ticket,
                        code=request.code_sha256 is not None,
                    )
                },
                metadata={
                    "fedtune.study": request.study_id,
                    "fedtune.attempt": str(request.attempt),
                },
            )
        except BackendError:
            raise
        except Exception as exc:
            self._client = None  # reconnect next time
            raise _unusable(f"Ray job submission to {self.address}", exc) or BackendError(
                f"Ray job submission failed: {exc}"
            ) from exc
        log.info("study %s: Ray job %s submitted", request.study_id, sid)
        return {"submission_id": sid, "address": self.address}

    def poll(self, ref: Mapping[str, Any]) -> DriverStatus:
        sid = str(ref["submission_id"])
        try:
            status = self._jobs().get_job_status(sid)
        except BackendError:
            raise
        except RuntimeError as exc:
            if "404" in str(exc) or "does not exist" in str(exc):
                return DriverStatus.GONE
            raise BackendError(f"Ray job {sid}: {exc}") from exc
        except Exception as exc:  # connection errors, authentication errors
            self._client = None
            raise _unusable(f"Ray job {sid}", exc) or BackendError(f"Ray job {sid}: {exc}") from exc
        return _STATUS.get(str(getattr(status, "value", status)), DriverStatus.RUNNING)

    def stop(self, ref: Mapping[str, Any]) -> None:
        sid = str(ref["submission_id"])
        try:
            self._jobs().stop_job(sid)
        except BackendError:
            raise
        except RuntimeError as exc:
            if "404" in str(exc) or "does not exist" in str(exc):
                return
            raise BackendError(f"stopping Ray job {sid}: {exc}") from exc
        except Exception as exc:
            self._client = None
            raise BackendError(f"stopping Ray job {sid}: {exc}") from exc

    def capacity_gpus(self) -> float | None:
        now = time.monotonic()
        if self._capacity is not None and now - self._capacity[0] < CAPACITY_TTL_S:
            return self._capacity[1]
        try:
            gpus: float | None = alive_gpus(self._list_nodes())
        except Exception as exc:  # dashboard down, an older Ray: capacity unknown for a while
            log.warning(
                "Ray cluster capacity unknown (GET %s/api/v0/nodes: %s); admission "
                "limits GPUs only by FEDTUNE_CLUSTER_GPUS",
                self.address,
                exc,
            )
            gpus = None
        self._capacity = (now, gpus)
        return gpus

    def _list_nodes(self) -> list[dict[str, Any]]:
        import httpx

        url = f"{self.address.rstrip('/')}/api/v0/nodes"
        reply = httpx.get(
            url, params={"limit": 10000, "detail": "true"}, headers=self._headers(), timeout=10.0
        )
        reply.raise_for_status()
        body = reply.json()
        rows = ((body.get("data") or {}).get("result") or {}).get("result")
        if not isinstance(rows, list):
            raise ValueError(f"unexpected reply: {str(body)[:200]}")
        return rows


def alive_gpus(nodes: list[Mapping[str, Any]]) -> float:
    """Sum of ``resources_total["GPU"]`` over the nodes whose ``state`` is ALIVE."""
    return float(
        sum(
            float((n.get("resources_total") or {}).get("GPU", 0.0))
            for n in nodes
            if n.get("state") == "ALIVE"
        )
    )
