"""The environment of every process the service starts: one allowlist.

A child of the service gets the variables named here and nothing else of the service's own
environment: a code check (uploaded code imported in a sandbox), a ``local`` study driver, a Ray
Jobs API driver (its ``runtime_env``) and a KubeRay RayJob's head (its pod ``env``); and a Ray
Jobs API driver that re-runs itself in a sandbox on a shared head gives that sandbox only what
:func:`head_driver_env` names of its own; ``fedtune mlflow-server`` gives MLflow what
:func:`mlflow_server_env` names. A variable not named here, a new secret setting among
them, is withheld by default.

* :data:`PLATFORM` — locale, thread counts and devices: every child, the sandbox included;
* :data:`HOST` — a driver on the service's own machine also keeps its home, temporary folder,
  Python path and the tuning layer's knobs (:data:`fedtune.tuning.env.VARIABLES`);
* then each kind's own settings, rendered from :class:`~.settings.Settings` (never copied from
  the environment), only those its process reads: the workdir, the heartbeat, the retry policy,
  the tracking URI, and the study's MLflow workspace (:func:`.mlflow_workspaces.driver_env_for`).

The service's API token, code URL key, Ray token and MLflow admin password reach no child. A
driver gets the URL it reports to and a one-time start ticket of its own study and attempt
(``FEDTUNE_DRIVER_URL``, ``FEDTUNE_DRIVER_TICKET``: :mod:`.tickets`) when the service has such a
URL, and no credential at all: it exchanges the ticket for its study's credential and its
project's MLflow login (:mod:`.driver_start`). Only a driver without such a URL gets the MLflow
login in its environment, and only a ``local`` one the database URL (a Ray job or RayJob driver
then reads it from its cluster's environment, never from the service).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from fedtune.tuning.env import VARIABLES as TUNING_VARIABLES

from .mlflow_workspaces import driver_env_for

if TYPE_CHECKING:  # only annotations: ``fedtune mlflow-server`` imports no settings model
    from .settings import Settings

__all__ = [
    "DRIVER_SANDBOX",
    "HOST",
    "PLATFORM",
    "SANDBOXED",
    "ChildKind",
    "child_env",
    "head_driver_env",
    "mlflow_server_env",
]


class ChildKind(enum.StrEnum):
    """Which child an environment is for."""

    CODE_CHECK = "code-check"  # uploaded code imported in the sandbox (``code_check``)
    LOCAL_DRIVER = "local-driver"  # ``fedtune worker run-study`` as the service's child
    RAY_JOB = "ray-job"  # a Ray Jobs API driver (backend ``ray``): its ``runtime_env``
    RAYJOB = "rayjob"  # a KubeRay RayJob's head pod (backend ``kubernetes``)
    HEAD_DRIVER = "head-driver"  # a Ray job's driver, re-run in a sandbox on a shared head


#: a driver's own variables a sandboxed head driver keeps (its Ray job's ``runtime_env`` and the
#: head's environment gave them; an MLflow login here is the head's own, its operator's: a driver
#: that reports to the API gets its project's with its ticket, never in an environment)
HEAD_DRIVER_KEEPS = frozenset(
    {
        "FEDTUNE_HEARTBEAT_S",
        "FEDTUNE_MAX_DISPATCH_ATTEMPTS",
        "FEDTUNE_RETRY_BACKOFF_S",
        "FEDTUNE_MAX_CODE_BYTES",
        "MLFLOW_TRACKING_URI",
        "MLFLOW_WORKSPACE",
        "MLFLOW_TRACKING_USERNAME",
        "MLFLOW_TRACKING_PASSWORD",
    }
)
#: set in a sandboxed driver's environment (both sandboxes): it checks what it may reach
SANDBOXED = "FEDTUNE_SANDBOXED"
#: set in a Ray job driver's environment for a study with uploaded code: the sandbox to re-run
#: itself in on the shared head (``FEDTUNE_CODE_SANDBOX`` of the service)
DRIVER_SANDBOX = "FEDTUNE_DRIVER_SANDBOX"


#: what any child may inherit: how the platform runs (locale, threads, devices), no credential
PLATFORM = frozenset(
    {
        "LANG",
        "LANGUAGE",
        "LC_ALL",
        "LC_CTYPE",
        "TZ",
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "OPENBLAS_CORETYPE",
        "OPENBLAS_L2_SIZE",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
    }
)
#: what a child on the service's own machine also inherits (the local driver)
HOST = (
    PLATFORM
    | frozenset(
        {
            "PATH",
            "HOME",
            "USER",
            "LOGNAME",
            "TMPDIR",
            "XDG_CACHE_HOME",
            "VIRTUAL_ENV",
            "PYTHONPATH",
            "PYTHONHASHSEED",
            "PYTHONUNBUFFERED",
            "PYTHONDONTWRITEBYTECODE",
            "RAY_USAGE_STATS_ENABLED",
            "RAY_DEDUP_LOGS",
            "RAY_AIR_NEW_OUTPUT",
            "MLFLOW_HTTP_REQUEST_TIMEOUT",
            "MLFLOW_HTTP_REQUEST_MAX_RETRIES",
            "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
            "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT",
        }
    )
    | frozenset(TUNING_VARIABLES)
)
#: what ``fedtune mlflow-server`` keeps beyond :data:`HOST`: MLflow's store and admin password,
#: and the artifact stores' own credentials (S3, GCS, Azure)
MLFLOW_SERVER_KEEPS = frozenset(
    {
        "MLFLOW_BACKEND_STORE_URI",
        "MLFLOW_AUTH_ADMIN_PASSWORD",
        "MLFLOW_SERVER_ALLOWED_HOSTS",  # added to --public-url's hosts (cli.mlflow_server)
        "MLFLOW_SERVER_CORS_ALLOWED_ORIGINS",
        "MLFLOW_S3_ENDPOINT_URL",
        "MLFLOW_S3_IGNORE_TLS",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_DEFAULT_REGION",
        "AWS_REGION",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCESS_KEY",
    }
)
#: the sandbox's fixed variables: its home and temporary folder are its private tmpfs
SANDBOX_FIXED = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "USER": "fedtune",
    "MPLCONFIGDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
    "OMP_NUM_THREADS": "1",
}


def child_env(
    settings: Settings,
    kind: ChildKind,
    *,
    project: str | None = None,
    ticket: str | None = None,
    code: bool = True,
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of a child of ``kind`` (see the module docstring).

    Args:
        settings: the service's settings.
        kind: which child.
        project: the study's project (its MLflow workspace), for drivers.
        ticket: a driver's one-time start ticket (``LaunchRequest.ticket``), given with the URL
            its drivers reach when the service has one (``drivers_report_to``).
        code: the study runs uploaded code. A ``local`` driver of a study without it, on a
            database several replicas may share (not SQLite), writes that database itself: its
            service's URL dies with that replica, while the replica that takes over adopts the
            driver (it runs no code of the member's, so it may hold the URL).
        environ: the service's environment (default: this process's).

    Returns:
        Variable -> value. For ``RAY_JOB`` and ``RAYJOB`` only the variables the service sets
        (the cluster's own environment supplies the rest). For ``HEAD_DRIVER``, ``settings``
        and ``environ`` are the Ray job driver's own (:func:`head_driver_env`).
    """
    environ = os.environ if environ is None else environ
    if kind is ChildKind.CODE_CHECK:  # and the operator's PYTHONPATH: its folders are mounted
        env = {k: v for k, v in environ.items() if k in PLATFORM or k == "PYTHONPATH"}
        return {**env, **SANDBOX_FIXED}
    if kind is ChildKind.HEAD_DRIVER:
        return head_driver_env(settings, environ)
    driver = {
        "FEDTUNE_HEARTBEAT_S": str(settings.heartbeat_s),
        **driver_env_for(settings, project),
        **_report_to(settings, ticket),
    }
    if kind is ChildKind.RAY_JOB and code:  # the driver sandboxes itself on the shared head
        driver[DRIVER_SANDBOX] = str(settings.code_sandbox)
        driver["FEDTUNE_STUDY_SANDBOX_MEMORY_MIB"] = str(settings.study_sandbox_memory_mib)
        driver["FEDTUNE_STUDY_SANDBOX_PROCESSES"] = str(settings.study_sandbox_processes)
    shared = not settings.database_url.startswith("sqlite")
    if kind is ChildKind.LOCAL_DRIVER and shared and not code:
        driver.pop("FEDTUNE_DRIVER_URL", None)
        driver.pop("FEDTUNE_DRIVER_TICKET", None)
    if "FEDTUNE_DRIVER_URL" in driver:  # the login comes with the ticket's redemption
        driver.pop("MLFLOW_TRACKING_USERNAME", None)
        driver.pop("MLFLOW_TRACKING_PASSWORD", None)
    if kind is not ChildKind.LOCAL_DRIVER:
        return driver
    env = {k: v for k, v in environ.items() if k in HOST}
    if "FEDTUNE_DRIVER_URL" not in driver:  # no URL: the driver writes the database itself
        env["FEDTUNE_DATABASE_URL"] = absolute_sqlite_url(settings.database_url)
    env.update(
        driver,
        FEDTUNE_WORKDIR=str(Path(settings.workdir).resolve()),
        FEDTUNE_BACKEND=str(settings.backend),
        FEDTUNE_MAX_DISPATCH_ATTEMPTS=str(settings.max_dispatch_attempts),
        FEDTUNE_RETRY_BACKOFF_S=str(settings.retry_backoff_s),
        FEDTUNE_MAX_CODE_BYTES=str(settings.max_code_bytes),
    )
    if settings.mlflow_tracking_uri:
        env["MLFLOW_TRACKING_URI"] = settings.mlflow_tracking_uri
    return env


def mlflow_server_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's variables ``fedtune mlflow-server`` keeps (:data:`HOST`,
    :data:`MLFLOW_SERVER_KEEPS`): none of fedtune's settings or tokens, no MLflow login.

    Args:
        environ: the caller's environment (default: this process's).

    Returns:
        Variable -> value.
    """
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k in HOST or k in MLFLOW_SERVER_KEEPS}


def _report_to(settings: Settings, ticket: str | None) -> dict[str, str]:
    """A driver's URL and start ticket for the service's driver routes (empty: none)."""
    url = settings.drivers_report_to
    if url is None or ticket is None:
        return {}
    return {"FEDTUNE_DRIVER_URL": url, "FEDTUNE_DRIVER_TICKET": ticket}


def head_driver_env(settings: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a Ray job's driver re-run in a sandbox on a shared head.

    The driver keeps what runs it (:data:`HOST`, Ray's own ``RAY_*`` variables: the cluster's
    address, its job and, on a cluster with token authentication, its token), its own settings
    (:data:`HEAD_DRIVER_KEEPS`), and the URL it reports to; nothing else of the head's
    environment (a database URL the cluster's processes carry, the head's other secrets), and
    neither its spent start ticket nor its credentials: those reach the sandboxed driver on its
    standard input (``head_sandbox.run_in_head_sandbox``).

    Args:
        settings: the driver's settings (its ``driver_url``).
        environ: the driver's environment, as the Ray job started it.

    Returns:
        Variable -> value.
    """
    env = {k: v for k, v in environ.items() if k in HOST or k.startswith("RAY_")}
    env.update({k: v for k, v in environ.items() if k in HEAD_DRIVER_KEEPS})
    env.pop("VIRTUAL_ENV", None)
    if settings.driver_url:
        env["FEDTUNE_DRIVER_URL"] = settings.driver_url
    env["FEDTUNE_WORKDIR"] = str(Path(settings.workdir).resolve())
    env[SANDBOXED] = "1"
    return env


def absolute_sqlite_url(url: str) -> str:
    """``url`` with a relative SQLite path made absolute (from this process's working
    directory): the driver runs in the workdir, where ``./fedtune.db`` would be a new, empty
    file. Other URLs are returned as they are.

    Args:
        url: an SQLAlchemy URL.

    Returns:
        The URL the driver opens the same database with.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return url
    if path.startswith("file:") or os.path.isabs(path):
        return url
    return parsed.set(database=os.path.abspath(path)).render_as_string(hide_password=False)
