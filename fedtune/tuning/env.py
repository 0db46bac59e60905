"""The environment variables the tuning layer reads, and the one module that reads them.

``fedtune tune``, a study driver and its trial processes take these knobs from the environment;
every read goes through a function here (``tests/unit/test_env_reads.py`` keeps it so). Each
function reads when called, not once at import: a driver's environment is set at run time (by the
service's backend, by Ray, by a test). ``environ`` replaces the process environment (tests).
Values come back as set; the caller parses them and names the variable in its errors.

The service's settings are read by :mod:`fedtune.service.settings`, the service client's by
:mod:`fedtune.client_settings`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "VARIABLES",
    "cache_dir",
    "cuda_visible_devices",
    "mlflow_tracking_uri",
    "ray_address",
    "ray_node_id",
    "ray_start_attempts",
    "ray_start_backoff_s",
    "sqlite_wal",
    "timeline_file",
]


#: the tuning layer's own variables (a local study driver inherits them: ``service.child_env``)
VARIABLES = (
    "FEDTUNE_SQLITE_WAL",
    "FEDTUNE_CACHE_DIR",
    "FEDTUNE_RAY_START_ATTEMPTS",
    "FEDTUNE_RAY_START_BACKOFF_S",
    "FEDTUNE_TIMELINE",
    "FEDTUNE_RAY_NODE_ID",
)


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def ray_address(environ: Mapping[str, str] | None = None) -> str | None:
    """Ray's own ``RAY_ADDRESS``: the cluster ``fedtune tune`` runs on without ``--ray-address``.

    Args:
        environ: the environment (default: this process's).

    Returns:
        The address, or None when unset or empty.
    """
    environ = _environ(environ)
    return environ.get("RAY_ADDRESS") or None


def mlflow_tracking_uri(environ: Mapping[str, str] | None = None) -> str | None:
    """MLflow's own ``MLFLOW_TRACKING_URI``: the tracking server of a study that names none.

    Args:
        environ: the environment (default: this process's).

    Returns:
        The URI, or None when unset or empty.
    """
    environ = _environ(environ)
    return environ.get("MLFLOW_TRACKING_URI") or None


def sqlite_wal(environ: Mapping[str, str] | None = None) -> str:
    """``FEDTUNE_SQLITE_WAL``: ``1`` forces WAL on the SQLite stores, ``0`` keeps the defaults.

    Args:
        environ: the environment (default: this process's).

    Returns:
        The value without surrounding blanks; ``""`` when unset.
    """
    environ = _environ(environ)
    return environ.get("FEDTUNE_SQLITE_WAL", "").strip()


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where fedtune keeps files it can rebuild (:mod:`fedtune.tuning.mlflow.sqlite_template`).

    ``FEDTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedtune``, else ``~/.cache/fedtune``.

    Args:
        environ: the environment (default: this process's).

    Returns:
        The directory (not created).
    """
    environ = _environ(environ)
    if environ.get("FEDTUNE_CACHE_DIR"):
        return Path(environ["FEDTUNE_CACHE_DIR"])
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fedtune"


def ray_start_attempts(environ: Mapping[str, str] | None = None) -> str:
    """``FEDTUNE_RAY_START_ATTEMPTS``: how often a study tries to start or join Ray.

    Args:
        environ: the environment (default: this process's).

    Returns:
        The value without surrounding blanks; ``""`` when unset.
    """
    environ = _environ(environ)
    return environ.get("FEDTUNE_RAY_START_ATTEMPTS", "").strip()


def ray_start_backoff_s(environ: Mapping[str, str] | None = None) -> str:
    """``FEDTUNE_RAY_START_BACKOFF_S``: seconds before the first retry of Ray's start (doubling).

    Args:
        environ: the environment (default: this process's).

    Returns:
        The value without surrounding blanks; ``""`` when unset.
    """
    environ = _environ(environ)
    return environ.get("FEDTUNE_RAY_START_BACKOFF_S", "").strip()


def timeline_file(environ: Mapping[str, str] | None = None) -> str | None:
    """``FEDTUNE_TIMELINE``: the file of the start-up timeline (:mod:`fedtune.tuning.common.timeline`).

    Args:
        environ: the environment (default: this process's).

    Returns:
        The path, or None when unset or empty (no timeline).
    """
    environ = _environ(environ)
    return environ.get("FEDTUNE_TIMELINE") or None


def cuda_visible_devices(environ: Mapping[str, str] | None = None) -> str | None:
    """CUDA's own ``CUDA_VISIBLE_DEVICES`` (for error messages only; CUDA applies it).

    Args:
        environ: the environment (default: this process's).

    Returns:
        The value, or None when unset.
    """
    environ = _environ(environ)
    return environ.get("CUDA_VISIBLE_DEVICES")


def ray_node_id(environ: Mapping[str, str] | None = None) -> str | None:
    """``FEDTUNE_RAY_NODE_ID``: the Ray node a driver in a PID namespace of its own joins.

    Ray finds the node a driver runs on among the processes it can see (the node's raylet); a
    sandboxed driver sees none of the node's, so its sandbox names the node
    (:mod:`fedtune.service.head_sandbox`).

    Args:
        environ: the environment (default: this process's).

    Returns:
        The node's id (hex), or None when unset or empty.
    """
    environ = _environ(environ)
    return environ.get("FEDTUNE_RAY_NODE_ID") or None
