"""What fedtune's database remembers of MLflow: the workspace made for each project.

The service records a project's workspace (``projects.mlflow_workspace``, revision 0009) once
MLflow has it (:class:`~.mlflow_sync.TenancyLoop`). A service started later on that database
without an MLflow server (no ``MLFLOW_TRACKING_URI``, ``FEDTUNE_MLFLOW_WORKSPACES`` unset) would
serve the project's members without their runs' links or their MLflow logins, and log new
studies to files on its own disk: :func:`require_mlflow_for_workspaces` refuses that in one
line naming what to set. An explicit ``FEDTUNE_MLFLOW_WORKSPACES=false`` is the operator's
decision to go on without MLflow: the service then starts and says so in one log line.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from fedtune.errors import ConfigError

from .mlflow_workspaces import workspace_for

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["record_workspaces", "recorded_workspaces", "require_mlflow_for_workspaces"]

log = logging.getLogger(__name__)


def record_workspaces(db: Any, projects: Iterable[str] | None = None) -> int:
    """Record the MLflow workspace of projects that have none recorded yet.

    Args:
        db: fedtune's :class:`~.db.Database`.
        projects: The projects whose workspaces MLflow now has (None: every project).

    Returns:
        How many projects were recorded now.
    """
    from sqlalchemy import select

    from .models import Project

    query = select(Project).where(Project.mlflow_workspace.is_(None))
    if projects is not None:
        query = query.where(Project.name.in_(list(projects)))
    with db.session() as session:
        rows = list(session.scalars(query))
        for row in rows:
            row.mlflow_workspace = workspace_for(row.name)
        return len(rows)


def recorded_workspaces(db: Any) -> list[str]:
    """The projects whose MLflow workspace is recorded.

    Args:
        db: fedtune's :class:`~.db.Database`.

    Returns:
        Their names, sorted; none on a database without the column yet (before revision 0009,
        or no tables: nothing was recorded).
    """
    from sqlalchemy import inspect, select

    from .models import Project

    if "projects" not in inspect(db.engine).get_table_names():
        return []
    columns = {c["name"] for c in inspect(db.engine).get_columns("projects")}
    if "mlflow_workspace" not in columns:
        return []
    query = select(Project.name).where(Project.mlflow_workspace.is_not(None))
    with db.session(readonly=True) as session:
        return sorted(session.scalars(query.order_by(Project.name)))


def require_mlflow_for_workspaces(settings: Settings) -> None:
    """Refuse a service without MLflow on a database whose projects have MLflow workspaces.

    Args:
        settings: The service's settings.

    Raises:
        ConfigError: Projects have workspaces, ``FEDTUNE_MLFLOW_WORKSPACES`` is off and was
            not set to false on purpose (one line naming what to set).
    """
    if settings.mlflow_workspaces:
        return
    from .db import Database

    db = Database(settings.database_url)
    try:
        projects = recorded_workspaces(db)
    finally:
        db.dispose()
    if not projects:
        return
    shown = ", ".join(projects[:5]) + (
        f" and {len(projects) - 5} more" if len(projects) > 5 else ""
    )
    if "mlflow_workspaces" in settings.model_fields_set:  # false, on purpose
        log.warning(
            "FEDTUNE_MLFLOW_WORKSPACES is false: the MLflow workspaces of %s are not used; their "
            "new studies log to files under the workdir",
            shown,
        )
        return
    raise ConfigError(
        "FEDTUNE_MLFLOW_WORKSPACES",
        f"the projects of this database have MLflow workspaces ({shown}) but no MLflow server "
        "is configured: start with --config FILE (its [mlflow] section), or set "
        "MLFLOW_TRACKING_URI, FEDTUNE_MLFLOW_WORKSPACES=true and FEDTUNE_MLFLOW_ADMIN_PASSWORD; "
        "FEDTUNE_MLFLOW_WORKSPACES=false starts without MLflow on purpose",
    )
