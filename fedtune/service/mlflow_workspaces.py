"""What a fedtune project is in MLflow: its workspace, its driver's credential and environment.

One fedtune project is one MLflow workspace (an MLflow server started with
``--enable-workspaces --app-name fedtune``: MLflow's basic-auth app with the user list scoped,
:mod:`.mlflow_app`): :func:`workspace_for` names it — the project's
own name, ``default`` for the ``default`` project, ``project-<name>`` for the few names MLflow
refuses (one character, or ``api``, ``ajax-api``, ``workspaces``, ``static-files``).

Study drivers log as ``fedtune-driver-<workspace>``, a member of that one workspace, whose
password is derived (HMAC-SHA256) from the admin password, so the service can hand it to a driver
without storing it and a driver never holds the admin credential. The service's own MLflow calls
for a study go to its project's workspace (:func:`study_mlflow`). Nothing here calls MLflow's
server: :mod:`.mlflow_tenancy` makes the workspaces and users these names refer to.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "DEFAULT_WORKSPACE",
    "DRIVER_PREFIX",
    "driver_env",
    "driver_env_for",
    "driver_password",
    "driver_user",
    "mlflow_workspace",
    "study_mlflow",
    "workspace_for",
]

DEFAULT_WORKSPACE = "default"
#: the prefix of every driver user's name (:func:`driver_user`)
DRIVER_PREFIX = "fedtune-driver-"
WORKSPACE_HEADER = "X-MLFLOW-WORKSPACE"
_RESERVED = frozenset({"workspaces", "api", "ajax-api", "static-files"})


def workspace_for(project: str | None) -> str:
    """The MLflow workspace of a fedtune project.

    Args:
        project: The project's name; None is the ``default`` project.

    Returns:
        ``default`` for the default project, the project's name where MLflow accepts it, else
        ``project-<name>``.
    """
    name = project or DEFAULT_WORKSPACE
    if len(name) < 2 or name in _RESERVED:
        return f"project-{name}"
    return name


def driver_user(workspace: str) -> str:
    """The MLflow user a study driver of ``workspace`` logs as.

    Args:
        workspace: The MLflow workspace.

    Returns:
        ``fedtune-driver-<workspace>``.
    """
    return f"{DRIVER_PREFIX}{workspace}"


def driver_password(admin_password: str, workspace: str) -> str:
    """The password of a workspace's driver user, derived from the MLflow admin password.

    Args:
        admin_password: The MLflow admin's password (the service's secret).
        workspace: The MLflow workspace.

    Returns:
        64 hex digits (HMAC-SHA256), the same for the same admin password and workspace, so
        nothing needs storing; it opens nothing but that workspace.
    """
    key = admin_password.encode()
    return hmac.new(key, f"fedtune-driver:{workspace}".encode(), hashlib.sha256).hexdigest()


def driver_env(admin_password: str, project: str | None) -> dict[str, str]:
    """The MLflow client environment of a study driver of ``project``.

    Args:
        admin_password: The MLflow admin's password.
        project: The study's project.

    Returns:
        ``MLFLOW_WORKSPACE``, ``MLFLOW_TRACKING_USERNAME`` and ``MLFLOW_TRACKING_PASSWORD`` of
        the driver user of the project's workspace (never the admin credential).
    """
    workspace = workspace_for(project)
    return {
        "MLFLOW_WORKSPACE": workspace,
        "MLFLOW_TRACKING_USERNAME": driver_user(workspace),
        "MLFLOW_TRACKING_PASSWORD": driver_password(admin_password, workspace),
    }


def driver_env_for(settings: Settings, project: str | None) -> dict[str, str]:
    """A study driver's MLflow environment under ``settings`` (empty without workspaces).

    Args:
        settings: The service's settings.
        project: The study's project.

    Returns:
        :func:`driver_env`'s variables when ``FEDTUNE_MLFLOW_WORKSPACES`` is on, else ``{}``.
    """
    password = getattr(settings, "mlflow_admin_password", None)
    if not getattr(settings, "mlflow_workspaces", False) or password is None:
        return {}
    return driver_env(password.get_secret_value(), project)


@contextlib.contextmanager
def mlflow_workspace(settings: Settings, project: str | None) -> Iterator[None]:
    """The service's own MLflow calls in the block go to ``project``'s workspace.

    Only this thread's calls: it sets MLflow's workspace context variable, not the process's
    ``MLFLOW_WORKSPACE``. Without ``FEDTUNE_MLFLOW_WORKSPACES`` it does nothing.

    Args:
        settings: The service's settings.
        project: The study's project.

    Returns:
        A context manager.
    """
    if not getattr(settings, "mlflow_workspaces", False):
        yield
        return
    from mlflow.utils.workspace_context import ServerWorkspaceContext

    with ServerWorkspaceContext(workspace_for(project)):
        yield


@contextlib.contextmanager
def study_mlflow(settings: Settings, study_id: str, project: str | None) -> Iterator[str]:
    """A study's MLflow store as the service reaches it: the service's MLflow calls in the block
    go to the study's project's workspace (:func:`mlflow_workspace`).

    Args:
        settings: The service's settings.
        study_id: The study.
        project: Its project.

    Returns:
        A context manager that yields the study's tracking URI.
    """
    from .paths import study_tracking_uri

    with mlflow_workspace(settings, project):
        yield study_tracking_uri(settings, study_id)
