"""The service's side of the MLflow tenancy: from its settings and database, every period.

With ``FEDTUNE_MLFLOW_WORKSPACES`` on, :func:`tenancy_from_settings` makes the
:class:`~.mlflow_tenancy.MlflowTenancy` of the tracking server, :func:`sync_from_database` brings
it in step with fedtune's projects, users and roles, and :class:`TenancyLoop` does so when a
project is created and periodically (``FEDTUNE_MLFLOW_SYNC_S``, 60 s by default), which bounds
how long a revoked user or a changed role lasts in MLflow.

Each sync's outcome is :attr:`TenancyLoop.health` (``/readyz``'s ``mlflow``): down, with MLflow's
answer as the reason, while MLflow refuses the service (its Host header, its admin login) or
does not answer. ``/readyz`` is open, so the reason names no project or user
(:meth:`TenancyLoop.public_reason`) and never the tracking URI; the log line has it whole.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from .backend_health import HealthState
from .mlflow_records import record_workspaces
from .mlflow_tenancy import MlflowTenancy, SyncReport, TenancyError
from .mlflow_workspaces import workspace_for

if TYPE_CHECKING:
    from .settings import Settings

__all__ = ["TenancyLoop", "scrub", "sync_from_database", "tenancy_from_settings"]

log = logging.getLogger(__name__)


def tenancy_from_settings(settings: Settings) -> MlflowTenancy | None:
    """The MLflow tenancy the settings describe, or None (``FEDTUNE_MLFLOW_WORKSPACES`` off).

    Args:
        settings: The service's settings.

    Returns:
        An :class:`MlflowTenancy` on ``MLFLOW_TRACKING_URI`` with the admin credential, or None.
    """
    if not settings.mlflow_workspaces or settings.mlflow_admin_password is None:
        return None
    return MlflowTenancy(
        settings.mlflow_tracking_uri,
        settings.mlflow_admin_username,
        settings.mlflow_admin_password.get_secret_value(),
    )


def sync_from_database(
    tenancy: MlflowTenancy, session: Any, drop_unknown: bool = False
) -> SyncReport:
    """Run :meth:`MlflowTenancy.sync` with the projects, users and roles of fedtune's database.

    A user who is disabled or whose every token is revoked or expired loses its MLflow login.

    Args:
        tenancy: The MLflow server's tenancy.
        session: A SQLAlchemy session of fedtune's database.
        drop_unknown: Also delete the MLflow logins of users fedtune does not know (OIDC).

    Returns:
        What changed.
    """
    from sqlalchemy import select

    from .models import ApiToken, Membership, Project, User, utcnow

    projects = [p.name for p in session.scalars(select(Project))]
    now = utcnow()
    live = {
        t.user_name
        for t in session.scalars(select(ApiToken).where(ApiToken.revoked_at.is_(None)))
        if t.expires_at is None or t.expires_at > now
    }
    enabled: dict[str, User] = {}
    disabled: list[str] = []
    for user in session.scalars(select(User)):
        if user.disabled_at is None and user.name in live:
            enabled[user.name] = user
        else:
            disabled.append(user.name)
    roles: dict[str, dict[str, str]] = {name: {} for name in enabled}
    for m in session.scalars(select(Membership)):
        if m.user_name in roles:
            roles[m.user_name][m.project] = m.role
    admins = [name for name, user in enabled.items() if user.is_admin]
    return tenancy.sync(projects, roles, admins, disabled, drop_unknown)


class TenancyLoop:
    """The service's thread that runs :func:`sync_from_database` every ``period_s`` seconds.

    :meth:`poke` asks for a sync now (after a project or a membership changed);
    :meth:`ensure` makes a project's workspace before its first study is dispatched. The MLflow
    logins of users fedtune's database does not know (OIDC users, made by :meth:`sync_user`)
    are deleted by the first sync after each multiple of ``oidc_login_s`` (Unix time), so such
    a login lasts at most that long; its owner asks for a new one, which reads its groups again.
    """

    def __init__(
        self, db: Any, tenancy: MlflowTenancy, period_s: float, oidc_login_s: float = 28800.0
    ) -> None:
        """Args:
        db: fedtune's :class:`~fedtune.service.db.Database`.
        tenancy: The MLflow server's tenancy.
        period_s: Seconds between two syncs.
        oidc_login_s: How long an OIDC user's MLflow login lasts at most.
        """
        import threading

        self.db = db
        self.tenancy = tenancy
        self.period_s = period_s
        self.oidc_login_s = oidc_login_s
        self._epoch: int | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._ready: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="fedtune-mlflow-sync", daemon=True)
        self.last: SyncReport | None = None
        #: the last sync's outcome (``/readyz``): up None until the first one ended
        self.health = HealthState(up=None)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.tenancy.close()

    def poke(self) -> None:
        """Sync soon (in the loop's thread), not waiting for the period to end."""
        self._wake.set()

    def ensure(self, project: str | None) -> str:
        """Make the project's workspace, roles and driver user if this process has not yet.

        A workspace made already is answered without the lock: a periodic sync holds it for as
        long as MLflow takes to answer (up to its requests' timeout when MLflow does not), and the
        scheduler's launches (:meth:`before_launch`) would wait that long for nothing.

        Args:
            project: The project.

        Returns:
            The workspace's name.
        """
        from .models import DEFAULT_PROJECT

        workspace = workspace_for(project)
        if workspace in self._ready:  # only ever added to
            return workspace
        with self._lock:
            if workspace not in self._ready:
                self.tenancy.ensure_workspace(project)
                record_workspaces(self.db, [project or DEFAULT_PROJECT])
                self._ready.add(workspace)
        return workspace

    def before_launch(self, request: Any) -> None:
        """The scheduler's hook: a study's workspace exists before its driver starts.

        Args:
            request: The :class:`~fedtune.service.backends.base.LaunchRequest`.

        Returns:
            None; raises ``BackendError`` when MLflow cannot be reached (the study stays queued).
        """
        from .backends.base import BackendError

        try:
            self.ensure(request.project)
        except (TenancyError, httpx.HTTPError) as exc:
            raise BackendError(
                f"the MLflow workspace of project {request.project!r}: {exc}"
            ) from exc

    def sync_now(self) -> SyncReport:
        """One sync, in the caller's thread.

        Returns:
            What changed.
        """
        import time

        from sqlalchemy import select

        from .models import Project

        epoch = int(time.time() // self.oidc_login_s)
        drop = self._epoch is not None and epoch != self._epoch
        try:
            with self._lock:
                with self.db.session(readonly=True) as session:  # one snapshot: these projects
                    self.last = sync_from_database(self.tenancy, session, drop_unknown=drop)
                    projects = list(session.scalars(select(Project.name)))
                record_workspaces(self.db, projects)  # their workspaces exist now
                self._epoch = epoch
        except (TenancyError, httpx.HTTPError) as exc:
            self._observed(False, exc)
            raise
        self._observed(True)
        return self.last

    def public_reason(self, exc: BaseException) -> str:
        """Why a sync failed, as ``/readyz`` (open to anyone) shows it: MLflow's answer or the
        connection's error, without the tracking URI or any project or user name.

        Args:
            exc: the sync's error.

        Returns:
            One line.
        """
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        first = first.replace(self.tenancy.url, "MLFLOW_TRACKING_URI")
        if not isinstance(exc, TenancyError):
            first = f"unreachable: {first}"
        try:
            with self.db.session(readonly=True) as session:
                return scrub(first, _names(session))
        except Exception:  # no database to read the names from: say less
            return first.split(":", 1)[0] + " (the service's log has MLflow's answer)"

    def _observed(self, up: bool, exc: BaseException | None = None) -> None:
        import time

        reason = self.public_reason(exc) if exc is not None else None
        before, self.health = self.health, HealthState(up, reason, time.monotonic())
        if not up and before.up is not False:
            log.error("MLflow tenancy sync failed (MLflow down for the service): %s", exc)
        elif up and before.up is False:
            log.warning("MLflow tenancy sync works again")

    def sync_user(self, name: str, roles: Mapping[str, str], *, admin: bool = False) -> None:
        """One user's MLflow roles now (its MLflow login is about to be issued).

        Args:
            name: The user.
            roles: {project: role}.
            admin: Whether it is an admin.
        """
        with self._lock:
            self.tenancy.sync_user(name, roles, admin=admin)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_now()
            except (TenancyError, httpx.HTTPError) as exc:  # logged when MLflow went down
                log.debug("MLflow tenancy sync failed: %s", exc)
            except Exception as exc:  # the next period tries again
                log.warning("MLflow tenancy sync failed: %s", exc)
            self._wake.wait(self.period_s)
            self._wake.clear()


def scrub(text: str, names: Iterable[str]) -> str:
    """``text`` with each of ``names`` (whole words) replaced by ``…``.

    Args:
        text: a line to show outside the service.
        names: the project, workspace and user names it must not show.

    Returns:
        The line.
    """
    for name in sorted({n for n in names if n}, key=len, reverse=True):
        text = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", "…", text)
    return text


def _names(session: Any) -> set[str]:
    """Every project, workspace, driver and user name fedtune's database holds."""
    from sqlalchemy import select

    from .mlflow_workspaces import driver_user
    from .models import Project, User

    projects = set(session.scalars(select(Project.name)))
    spaces = {workspace_for(p) for p in projects}
    return (
        projects
        | spaces
        | {driver_user(w) for w in spaces}
        | set(session.scalars(select(User.name)))
    )
