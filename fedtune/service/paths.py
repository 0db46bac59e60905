"""Where a study's files live, and which MLflow store it logs to (service and driver agree)."""

from __future__ import annotations

from pathlib import Path

from .settings import Settings

__all__ = ["study_tracking_uri", "study_workdir"]


def study_workdir(settings: Settings, study_id: str) -> Path:
    """``<FEDTUNE_WORKDIR>/studies/<id>``: Optuna storage, Ray session, artifacts."""
    return Path(settings.workdir).resolve() / "studies" / study_id


def study_tracking_uri(settings: Settings, study_id: str) -> str:
    """``MLFLOW_TRACKING_URI``, else a SQLite MLflow store inside the study's workdir (the
    default of ``fedtune.tuning.tracking.resolve_tracking_uri``, made explicit)."""
    if settings.mlflow_tracking_uri:
        return settings.mlflow_tracking_uri
    return f"sqlite:///{study_workdir(settings, study_id) / 'mlflow.db'}"
