"""Where a study's files live, and which MLflow store it logs to (service and driver agree)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from fedtune.errors import ConfigError

from .settings import Settings

__all__ = ["check_workdir", "study_tracking_uri", "study_workdir"]


def check_workdir(settings: Settings) -> Path:
    """``FEDTUNE_WORKDIR``, created if missing, after proving this process can write in it;
    otherwise a ``ConfigError`` whose one line says which path, which user and why."""
    path = Path(settings.workdir).resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fedtune-write-check-"):
            pass
    except OSError as exc:
        raise ConfigError(
            "FEDTUNE_WORKDIR",
            f"{path} is not writable by uid {os.getuid()} ({exc.strerror or exc}); mount a "
            "writable volume there (emptyDir or PersistentVolumeClaim) or point it at one",
        ) from None
    return path


def study_workdir(settings: Settings, study_id: str) -> Path:
    """``<FEDTUNE_WORKDIR>/studies/<id>``: Optuna storage, Ray session, artifacts."""
    return Path(settings.workdir).resolve() / "studies" / study_id


def study_tracking_uri(settings: Settings, study_id: str) -> str:
    """``MLFLOW_TRACKING_URI``, else a SQLite MLflow store inside the study's workdir (the
    default of ``fedtune.tuning.mlflow.client.resolve_tracking_uri``, made explicit)."""
    if settings.mlflow_tracking_uri:
        return settings.mlflow_tracking_uri
    return f"sqlite:///{study_workdir(settings, study_id) / 'mlflow.db'}"
