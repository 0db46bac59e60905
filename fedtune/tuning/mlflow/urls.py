"""Links into the MLflow UI: a run's page, an experiment's runs table.

Light on purpose (no MLflow import): the service builds these links while it answers a request.
"""

from __future__ import annotations

from urllib.parse import quote

__all__ = ["UI_QUERY", "run_url", "ui_url"]

UI_QUERY = "workflowType=machine_learning"  # MLflow 3 opens on GenAI pages without it


def run_url(
    uri: str | None, experiment_id: str | None, run_id: str, workspace: str | None = None
) -> str | None:
    """A run's page on the tracking server ``uri``, in its MLflow workspace when it has one.

    Args:
        uri: the tracking URI as shown (credentials removed).
        experiment_id: the run's experiment.
        run_id: the run.
        workspace: the run's MLflow workspace (a server with workspaces opens "Select
            workspace" for a link without one).

    Returns:
        The URL, or None for a store that is no server (a local file has no page).
    """
    if not uri or not uri.startswith(("http://", "https://")):
        return None
    query = UI_QUERY + (f"&workspace={quote(workspace, safe='')}" if workspace else "")
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{query}"


def ui_url(uri: str, experiment_id: str) -> str:
    """The experiment's runs table: on the tracking server, or on ``mlflow ui``'s default
    address (127.0.0.1:5000) for a local store."""
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/runs?{UI_QUERY}"
