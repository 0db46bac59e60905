"""fedtune's MLflow server app: MLflow's basic-auth app, with the user list scoped to a caller's
workspaces (``mlflow server --enable-workspaces --app-name fedtune``).

MLflow's basic-auth app answers ``GET /api/2.0/mlflow/users/list`` (and its ``/ajax-api`` twin)
to any workspace member with every user of the server. fedtune names its driver accounts
``fedtune-driver-<project>`` and makes one login per project member, so that list named every
project and its members to anyone with a login. Here a caller who is not an MLflow admin gets
only the users that share a workspace with them (themselves included): the members and driver
of their own projects, as ``GET /v1/projects`` shows them through fedtune's API. Everything else
is MLflow's basic-auth app unchanged (registered as the ``mlflow.app`` entry point ``fedtune``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app", "visible_users"]


def visible_users(
    requester: str, users_with_workspaces: list[tuple[str, set[str]]]
) -> set[str] | None:
    """Which users ``requester`` may see listed.

    Args:
        requester: the caller's MLflow user name.
        users_with_workspaces: every user and the workspaces it holds a role in.

    Returns:
        The user names that share a workspace with ``requester`` (and ``requester``).
    """
    mine = next((spaces for name, spaces in users_with_workspaces if name == requester), set())
    return {name for name, spaces in users_with_workspaces if name == requester or spaces & mine}


def create_app(app: Any = None) -> Any:
    """MLflow's basic-auth app with the user list scoped (see the module docstring).

    Called with no app (uvicorn's factory call, in a server's process or worker), it imports
    MLflow's server with Python's cyclic collector paused and then freezes every object alive
    (``fedtune.tuning.common.start_gc``), as fedtune's other processes do at their start.

    Args:
        app: the MLflow Flask app (default: MLflow's server app).

    Returns:
        The app.
    """
    if app is not None:
        return _create_app(app)
    from fedtune.tuning.common import start_gc

    start_gc.pause()
    try:
        return _create_app(None)
    finally:
        start_gc.resume()


def _create_app(app: Any) -> Any:
    """:func:`create_app`'s work, with the collector as the caller left it."""
    from flask import request
    from mlflow.server import app as mlflow_app
    from mlflow.server import auth
    from mlflow.server.auth.routes import AJAX_LIST_USERS, LIST_USERS

    flask_app = app if app is not None else mlflow_app

    @flask_app.after_request  # on the Flask app, before basic-auth wraps it (uvicorn: FastAPI)
    def _scope_user_list(response: Any) -> Any:
        if request.path not in (LIST_USERS, AJAX_LIST_USERS) or response.status_code != 200:
            return response
        caller = auth.authenticate_request()
        username = getattr(caller, "username", None)
        if username is None or auth.store.get_user(username).is_admin:
            return response
        every = [
            (u.username, {r.workspace for r in roles})
            for u, roles in auth.store.list_users_with_roles()
        ]
        keep = visible_users(username, every)
        data = response.get_json()
        data["users"] = [u for u in data.get("users", []) if u.get("username") in keep]
        response.set_data(flask_app.json.dumps(data))
        return response

    return auth.create_app(flask_app)
