"""The MLflow links the service hands out: one place builds them, for studies and comparisons.

A member opens MLflow where the operator published it (``FEDTUNE_MLFLOW_PUBLIC_URL``: an
ingress, a port-forward), which is often not the address the service logs to (an in-cluster
Service); without it, an http(s) tracking URI is shown, credentials removed. With MLflow
workspaces every link names the project's workspace: a link without one lands on MLflow's
"Select workspace" page. A local file store has no UI to link to, and its path on the service's
disk is never shown.
"""

from __future__ import annotations

from urllib.parse import quote

from fedtune.tuning.mlflow.urls import run_url
from fedtune.wire_models import MlflowLinks

from .mlflow_workspaces import workspace_for
from .redact import redact_uri
from .settings import Settings

__all__ = ["LOGIN_ROUTE", "mlflow_links", "ui_base", "workspace_of"]

#: the route that makes a member's MLflow login (``fedtune mlflow-login``)
LOGIN_ROUTE = "/v1/users/{user}/mlflow-login"


def ui_base(settings: Settings, tracking_uri: str | None) -> str | None:
    """The MLflow UI's base URL a member opens.

    Args:
        settings: the service's settings.
        tracking_uri: where the study's runs are tracked.

    Returns:
        ``FEDTUNE_MLFLOW_PUBLIC_URL``, else the tracking URI when it is http(s) (credentials
        removed); None for a file store.
    """
    if settings.mlflow_public_url:
        return settings.mlflow_public_url
    shown = redact_uri(tracking_uri)
    return shown.rstrip("/") if shown and shown.startswith(("http://", "https://")) else None


def workspace_of(settings: Settings, project: str | None) -> str | None:
    """The MLflow workspace of ``project``, or None when MLflow keeps no workspaces."""
    return workspace_for(project) if settings.mlflow_workspaces else None


def mlflow_links(
    settings: Settings,
    tracking_uri: str | None,
    project: str | None,
    experiment_id: str | None,
    run_id: str | None,
) -> MlflowLinks:
    """Where a run is tracked, and the links that open it.

    Args:
        settings: the service's settings.
        tracking_uri: where it is tracked.
        project: its project.
        experiment_id: its experiment.
        run_id: the run (None: not started yet).

    Returns:
        The links (a file store: no URL).
    """
    base = ui_base(settings, tracking_uri)
    workspace = workspace_of(settings, project)
    ui = None
    if base:
        ui = f"{base}/#/experiments" + (
            f"?workspace={quote(workspace, safe='')}" if workspace else ""
        )
    return MlflowLinks(
        tracking_uri=redact_uri(tracking_uri),
        experiment_id=experiment_id,
        run_id=run_id,
        run_url=run_url(base, experiment_id, run_id, workspace) if run_id else None,
        ui_url=ui,
        workspace=workspace,
        login=LOGIN_ROUTE if workspace else None,
    )
