"""Execution backends of the study driver, chosen by ``FEDTUNE_BACKEND`` (see ``base.py``)."""

from __future__ import annotations

from ..settings import BackendKind, Settings
from .base import Backend, DriverStatus, LaunchRequest, driver_argv

__all__ = ["Backend", "DriverStatus", "LaunchRequest", "driver_argv", "make_backend"]


def make_backend(settings: Settings) -> Backend | None:
    """The configured backend; ``None`` for ``none`` (studies stay queued)."""
    if settings.backend == BackendKind.LOCAL:
        from .local import LocalBackend

        return LocalBackend(settings)
    if settings.backend == BackendKind.RAY:
        from .ray_jobs import RayJobsBackend

        return RayJobsBackend(settings)
    if settings.backend == BackendKind.KUBERNETES:
        from .kubernetes import KubernetesBackend

        return KubernetesBackend(settings)
    return None
