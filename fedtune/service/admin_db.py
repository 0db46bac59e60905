"""Users and projects on the service's database, answered as the API answers them.

:class:`DatabaseAdmin` is the administration of :mod:`.identity` with the SDK's method names,
arguments and answer types (:class:`fedtune.client.Client`'s ``create_user``, ``users``,
``projects``, …): the admin-only ``/v1/users`` and ``/v1/projects`` routes call it after their
checks, and ``fedtune users …``/``fedtune projects …`` call it, or the SDK over the API, behind
one contract (``fedtune.cli.admin_target.Admin``), so both print the same. Each call is one
transaction.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.wire_models import (
    MembershipOut,
    ProjectDetail,
    ProjectOut,
    Quota,
    StudyCounts,
    TokenInfo,
    TokenOut,
    Usage,
    UserOut,
)

from . import identity
from .project_usage import project_usage

if TYPE_CHECKING:
    from .db import Database
    from .settings import Settings

__all__ = ["DatabaseAdmin", "sqlite_file"]


class DatabaseAdmin:
    """The admin verbs on fedtune's database.

    Args:
        db: The service's database.
        settings: Its settings (a project's usage reads the fair-share window).
    """

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db, self.settings = db, settings

    def users(self) -> list[UserOut]:
        """Every user with its roles and live token ids."""
        with self.db.session(readonly=True) as session:
            rows = identity.list_users(session)
        return [UserOut(**{**r, "tokens": [TokenInfo(**t) for t in r["tokens"]]}) for r in rows]

    def create_user(
        self,
        name: str,
        project: str | None = None,
        role: str = "member",
        *,
        admin: bool = False,
        expires_in_days: float | None = None,
    ) -> TokenOut:
        """A user, a member of ``project`` when given, and its first token (shown once)."""
        with self.db.session() as session:
            identity.create_user(session, name, admin=admin)
            if project is not None:
                identity.add_member(session, name, project, role)
            issued = identity.issue_token(session, name, expires_at=_expiry(expires_in_days))
        return _token(issued)

    def new_token(
        self, user: str, expires_in_days: float | None = None, *, label: str | None = None
    ) -> TokenOut:
        """Another token for ``user`` (rotation; its other tokens stay valid)."""
        with self.db.session() as session:
            issued = identity.issue_token(
                session, user, expires_at=_expiry(expires_in_days), label=label
            )
        return _token(issued)

    def revoke(self, user: str, token_id: str | None = None) -> int:
        """Revoke all of ``user``'s live tokens, or one; how many were live."""
        with self.db.session() as session:
            return identity.revoke(session, user, token_id)

    def set_role(self, user: str, project: str, role: str = "member") -> MembershipOut:
        """Give ``user`` ``role`` in ``project``."""
        with self.db.session() as session:
            identity.add_member(session, user, project, role)
        return MembershipOut(user=user, project=project, role=role)

    def projects(self) -> list[ProjectOut]:
        """Every project, with its quotas."""
        with self.db.session(readonly=True) as session:
            return [_project(p) for p in identity.projects(session)]

    def project(self, name: str) -> ProjectDetail:
        """A project's quotas and what it uses now."""
        with self.db.session(readonly=True) as session:
            base = _project(identity.require_project(session, name))
            used = project_usage(session, name, self.settings)
        usage = Usage(
            studies=StudyCounts(**used["studies"]),
            gpus=used["gpus"],
            trials=used["trials"],
            gpu_hours=used["gpu_hours"],
        )
        return ProjectDetail.from_attributes(base, usage=usage)

    def create_project(self, name: str) -> ProjectOut:
        """A new project, without quotas."""
        with self.db.session() as session:
            return _project(identity.create_project(session, name))

    def set_quota(self, name: str, **quota: float | int | None) -> ProjectOut:
        """Set the project settings given by their API names (``gpus``, ``weight``, …)."""
        columns = {api: column for column, (api, _, _) in identity.QUOTA_FIELDS.items()}
        values = {columns.get(k, k): v for k, v in quota.items()}
        with self.db.session() as session:
            return _project(identity.set_quota(session, name, **values))


def _expiry(days: float | None) -> dt.datetime | None:
    return None if days is None else dt.datetime.now(dt.UTC) + dt.timedelta(days=days)


def _token(issued: identity.IssuedToken) -> TokenOut:
    return TokenOut(
        user=issued.user, token_id=issued.id, token=issued.secret, expires_at=issued.expires_at
    )


def _project(row: Any) -> ProjectOut:
    described = identity.describe_project(row)
    return ProjectOut(**{**described, "quota": Quota(**described["quota"])})


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names.

    Args:
        url: An SQLAlchemy URL.

    Returns:
        The file, absolute (a relative one against the working directory); None for another
        database or an in-memory one.
    """
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    name = parsed.database
    if parsed.get_backend_name() != "sqlite" or name in (None, "", ":memory:"):
        return None
    if name.startswith("file:"):  # a URI filename: its path, without the query
        name = name.removeprefix("file:").split("?", 1)[0]
    return Path(name).resolve()
