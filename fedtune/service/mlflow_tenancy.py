"""Keep MLflow's workspaces, users and roles in step with fedtune's projects and roles.

MLflow's basic-auth app (3.17) has workspace-scoped roles (RBAC). Each workspace
(:func:`~.mlflow_workspaces.workspace_for`) gets two roles that this module owns:

* ``fedtune-member``: ``workspace *`` ``USE`` (create experiments and runs there) and
  ``experiment *`` ``EDIT`` (read and log to every experiment of the workspace);
* ``fedtune-viewer``: ``experiment *`` ``READ`` only (no create, no log).

A fedtune admin is an MLflow admin (``is_admin``: everything). A user who has no role in a
workspace gets 403 on its experiments and runs and never sees them listed (with
``default_permission = NO_PERMISSIONS`` and ``grant_default_workspace_access = false``). Each
workspace's driver user is a member of it.

:meth:`MlflowTenancy.sync` is idempotent, so it can run again whenever fedtune changes
(:mod:`.mlflow_sync` runs it). Everything goes through MLflow's REST API with the admin
credential; nothing here touches MLflow's databases.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from fedtune.errors import ConfigError

from .mlflow_workspaces import (
    DEFAULT_WORKSPACE,
    DRIVER_PREFIX,
    driver_env,
    driver_password,
    driver_user,
    workspace_for,
)

__all__ = [
    "MEMBER_ROLE",
    "VIEWER_ROLE",
    "MlflowTenancy",
    "SyncReport",
    "TenancyError",
]

log = logging.getLogger(__name__)

MEMBER_ROLE = "fedtune-member"
VIEWER_ROLE = "fedtune-viewer"
#: the permissions of each role this module owns, as (resource type, pattern, permission)
ROLE_GRANTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    MEMBER_ROLE: (("workspace", "*", "USE"), ("experiment", "*", "EDIT")),
    VIEWER_ROLE: (("experiment", "*", "READ"),),
}
_ROLE_OF = {"member": MEMBER_ROLE, "viewer": VIEWER_ROLE}


class TenancyError(RuntimeError):
    """MLflow refused a call of the tenancy (its answer is the message)."""


@dataclass
class SyncReport:
    """What one :meth:`MlflowTenancy.sync` changed (empty lists: already in step)."""

    workspaces: list[str] = field(default_factory=list)
    users: list[str] = field(default_factory=list)
    assigned: list[str] = field(default_factory=list)
    unassigned: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return any((self.workspaces, self.users, self.assigned, self.unassigned, self.deleted))


class MlflowTenancy:
    """An MLflow server's workspaces, users and roles, driven by its admin credential."""

    def __init__(
        self,
        url: str,
        admin_user: str,
        admin_password: str,
        *,
        timeout_s: float = 15.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """Args:
        url: The MLflow tracking server (``http(s)://host:port``).
        admin_user: The MLflow admin's user name.
        admin_password: The MLflow admin's password.
        timeout_s: Timeout of each request.
        transport: An httpx transport (tests).
        """
        if not url.startswith(("http://", "https://")):
            raise ConfigError(
                "MLFLOW_TRACKING_URI", f"must be an http(s) tracking server, got {url!r}"
            )
        self.url = url.rstrip("/")
        self._admin_password = admin_password
        self._http = httpx.Client(
            base_url=self.url,
            auth=(admin_user, admin_password),
            timeout=timeout_s,
            transport=transport,
        )
        self.admin_user = admin_user

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ REST helpers

    def _call(
        self, method: str, path: str, *, ok: tuple[int, ...] = (200, 201), **kwargs: Any
    ) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        if response.status_code not in ok:
            raise TenancyError(
                f"MLflow {method} {path} answered {response.status_code}: {response.text[:300]}"
            )
        return response

    def _users(self) -> dict[str, dict]:
        body = self._call("GET", "/api/2.0/mlflow/users/list").json()
        return {u["username"]: u for u in body.get("users", [])}

    def _workspaces(self) -> set[str]:
        body = self._call("GET", "/api/3.0/mlflow/workspaces").json()
        return {w["name"] for w in body.get("workspaces", [])}

    def _roles(self, workspace: str) -> dict[str, dict]:
        body = self._call("GET", "/api/3.0/mlflow/roles/list", params={"workspace": workspace})
        return {r["name"]: r for r in body.json().get("roles", [])}

    # ------------------------------------------------------------------ building blocks

    def ensure_workspace(self, project: str | None, report: SyncReport | None = None) -> str:
        """Create a project's workspace, its two roles and its driver user where missing.

        Args:
            project: The project (None: ``default``).
            report: Collects what changed.

        Returns:
            The workspace's name.
        """
        report = report if report is not None else SyncReport()
        workspace = workspace_for(project)
        if workspace != DEFAULT_WORKSPACE and workspace not in self._workspaces():
            self._call(
                "POST",
                "/api/3.0/mlflow/workspaces",
                json={"name": workspace, "description": f"fedtune project {project}"},
            )
            report.workspaces.append(workspace)
        roles = self._ensure_roles(workspace)
        user = driver_user(workspace)
        password = self.driver_password(workspace)
        if user not in self._users():
            self._create_user(user, password)
            report.users.append(user)
        elif not self._password_works(user, password):
            self._call(
                "PATCH",
                "/api/2.0/mlflow/users/update-password",
                json={"username": user, "password": password},
            )
        if roles[MEMBER_ROLE] not in {r["id"] for r in self._user_roles(user)}:
            self._assign(user, roles[MEMBER_ROLE])
            report.assigned.append(f"{user}:{workspace}:{MEMBER_ROLE}")
        return workspace

    def _ensure_roles(self, workspace: str) -> dict[str, int]:
        found = self._roles(workspace)
        ids: dict[str, int] = {}
        for name, grants in ROLE_GRANTS.items():
            role = found.get(name)
            if role is None:
                role = self._call(
                    "POST",
                    "/api/3.0/mlflow/roles/create",
                    json={"workspace": workspace, "name": name, "description": "fedtune"},
                ).json()["role"]
            have = {
                (p["resource_type"], p["resource_pattern"], p["permission"])
                for p in role.get("permissions") or []
            }
            for resource_type, pattern, permission in grants:
                if (resource_type, pattern, permission) not in have:
                    self._call(
                        "POST",
                        "/api/3.0/mlflow/roles/permissions/add",
                        json={
                            "role_id": role["id"],
                            "resource_type": resource_type,
                            "resource_pattern": pattern,
                            "permission": permission,
                        },
                    )
            ids[name] = role["id"]
        return ids

    def _create_user(self, username: str, password: str | None = None) -> None:
        self._call(
            "POST",
            "/api/2.0/mlflow/users/create",
            json={"username": username, "password": password or secrets.token_urlsafe(32)},
        )

    def _assign(self, username: str, role_id: int) -> None:
        self._call(
            "POST", "/api/3.0/mlflow/roles/assign", json={"username": username, "role_id": role_id}
        )

    def _unassign(self, username: str, role_id: int) -> None:
        self._call(
            "DELETE",
            "/api/3.0/mlflow/roles/unassign",
            json={"username": username, "role_id": role_id},
            ok=(200, 204),
        )

    def _password_works(self, username: str, password: str) -> bool:
        response = httpx.get(
            f"{self.url}/api/2.0/mlflow/users/current",
            auth=(username, password),
            timeout=self._http.timeout,
        )
        return response.status_code == 200

    # ------------------------------------------------------------------ public

    def driver_password(self, workspace: str) -> str:
        """The password of a workspace's driver user (see :func:`driver_password`).

        Args:
            workspace: The MLflow workspace.

        Returns:
            64 hex digits.
        """
        return driver_password(self._admin_password, workspace)

    def driver_env(self, project: str | None) -> dict[str, str]:
        """The MLflow client environment of a study driver of ``project``.

        Args:
            project: The study's project.

        Returns:
            See :func:`driver_env`.
        """
        return driver_env(self._admin_password, project)

    def issue_password(self, username: str) -> str:
        """Give ``username`` a new random MLflow password (creating the MLflow user if missing).

        Args:
            username: The fedtune user (also the MLflow user name).

        Returns:
            The new password: shown to its owner once, never stored by fedtune.
        """
        if not self.manages(username):
            raise TenancyError(f"{username!r} is MLflow's admin or a driver: no login is issued")
        password = secrets.token_urlsafe(24)
        if username not in self._users():
            self._create_user(username, password)
        else:
            self._call(
                "PATCH",
                "/api/2.0/mlflow/users/update-password",
                json={"username": username, "password": password},
            )
        return password

    def sync(
        self,
        projects: Iterable[str],
        roles: Mapping[str, Mapping[str, str]],
        admins: Iterable[str] = (),
        disabled: Iterable[str] = (),
        drop_unknown: bool = False,
    ) -> SyncReport:
        """Bring MLflow in step with fedtune: workspaces, users, roles, admins (idempotent).

        Args:
            projects: Every fedtune project.
            roles: user -> {project: ``member`` | ``viewer``} of every enabled user.
            admins: The enabled fedtune admins (MLflow admins).
            disabled: Users who may no longer log in (disabled, or every token revoked): their
                MLflow users are deleted.
            drop_unknown: Delete, too, the MLflow users fedtune does not know (the logins of
                OIDC users, made by :meth:`sync_user`); else they are left as they are.

        Returns:
            What changed.
        """
        report = SyncReport()
        role_ids: dict[str, dict[str, int]] = {}
        for project in sorted(set(projects) | {DEFAULT_WORKSPACE}):
            workspace = self.ensure_workspace(project, report)
            role_ids[workspace] = self._ensure_roles(workspace)
        users = self._users()
        admins = set(admins)
        for name in sorted(set(roles) | admins):
            if not self._managed(name):
                continue
            self._sync_one(name, roles.get(name) or {}, name in admins, users, role_ids, report)
        known, gone = set(roles) | admins, set(disabled)
        for name in sorted(users):
            if not self._managed(name) or name in known:
                continue
            if name in gone or drop_unknown:
                self._call(
                    "DELETE", "/api/2.0/mlflow/users/delete", json={"username": name}, ok=(200, 204)
                )
                report.deleted.append(name)
        if report.changed:
            log.info("MLflow tenancy: %s", report)
        return report

    def sync_user(self, name: str, roles: Mapping[str, str], *, admin: bool = False) -> SyncReport:
        """Bring one user's MLflow roles in step with ``roles`` (its projects' workspaces first).

        Args:
            name: The user.
            roles: {project: ``member`` | ``viewer``}.
            admin: Whether it is a fedtune admin.

        Returns:
            What changed.
        """
        report = SyncReport()
        role_ids = {}
        for project in sorted(roles):
            workspace = self.ensure_workspace(project, report)
            role_ids[workspace] = self._ensure_roles(workspace)
        # roles of workspaces it is not in are owned too: collect them to unassign
        for role in self._user_roles(name):
            if role["name"] in ROLE_GRANTS:
                role_ids.setdefault(role["workspace"], {})[role["name"]] = role["id"]
        if self._managed(name):
            self._sync_one(name, roles, admin, self._users(), role_ids, report)
        return report

    def _managed(self, name: str) -> bool:
        return self.manages(name)

    def manages(self, name: str) -> bool:
        """Whether ``name`` is a user this module keeps in step (not the admin, not a driver).

        Args:
            name: An MLflow user name.

        Returns:
            True for a fedtune user's MLflow login.
        """
        return name != self.admin_user and not name.startswith(DRIVER_PREFIX)

    def _user_roles(self, username: str) -> list[dict]:
        body = self._call(
            "GET",
            "/api/3.0/mlflow/users/roles/list",
            params={"username": username},
            ok=(200, 404),  # 404: no such user yet
        )
        return body.json().get("roles", []) if body.status_code == 200 else []

    def _sync_one(
        self,
        name: str,
        roles: Mapping[str, str],
        admin: bool,
        users: dict[str, dict],
        role_ids: Mapping[str, Mapping[str, int]],
        report: SyncReport,
    ) -> None:
        owned = {rid: (ws, role) for ws, ids in role_ids.items() for role, rid in ids.items()}
        if name not in users:
            self._create_user(name)  # no usable password until it asks for one
            report.users.append(name)
            users[name] = {"username": name, "is_admin": False, "roles": []}
        if bool(users[name].get("is_admin")) != admin:
            self._call(
                "PATCH",
                "/api/2.0/mlflow/users/update-admin",
                json={"username": name, "is_admin": admin},
            )
        want = set()
        for project, role in roles.items():
            workspace = workspace_for(project)
            if role in _ROLE_OF and _ROLE_OF[role] in role_ids.get(workspace, {}):
                want.add(role_ids[workspace][_ROLE_OF[role]])
        have = {r["id"] for r in users[name].get("roles") or []} & set(owned)
        for rid in sorted(want - have):
            self._assign(name, rid)
            report.assigned.append(f"{name}:{owned[rid][0]}:{owned[rid][1]}")
        for rid in sorted(have - want):
            self._unassign(name, rid)
            report.unassigned.append(f"{name}:{owned[rid][0]}:{owned[rid][1]}")
