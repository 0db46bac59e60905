"""Users, projects, memberships and per-user API tokens.

The team's tables of revision 0004 (``users``, ``projects``, ``memberships``, ``api_tokens``),
used by the admin commands (``fedtune users …``, ``fedtune projects …``), the admin routes and
the authentication of every request:

* a token is ``ftk_<id>_<secret>``: ``id`` (12 hex digits) is the row's public key, ``secret``
  32 random bytes (``secrets.token_urlsafe``); only ``sha256(secret)`` is stored, compared in
  constant time. It is shown once, when made. A user may hold several (rotation); each may
  expire; ``revoke`` ends all of a user's tokens (or one, by id);
* roles: ``admin`` (a user flag: everything), and per project ``member`` (submit, read, cancel
  the project's studies) or ``viewer`` (read only) — Kubeflow Profiles' contributor/viewer;
* :func:`principal_for_token` resolves a bearer token to a :class:`~.access.Principal`, or
  ``None`` (unknown, revoked, expired, disabled user: the caller answers 401 for all alike).

Names are DNS-label-like (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, ≤ 63) so a project maps onto a
Kueue LocalQueue or a namespace without translation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from fedtune.errors import ConflictError, InvalidRequestError, NotFoundError

from .access import Principal
from .models import ApiToken, Membership, Project, User, utcnow

__all__ = [
    "QUOTA_FIELDS",
    "ROLES",
    "IssuedToken",
    "add_member",
    "create_project",
    "create_user",
    "describe_project",
    "issue_token",
    "list_users",
    "principal_for_token",
    "projects",
    "require_project",
    "revoke",
    "set_quota",
]

ROLES = ("member", "viewer")
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: a project's settings: column -> (name in the API and the CLI, least, most). The bounds fit
#: the columns (INTEGER: at most 2**31 - 1) and keep the fair-share division (usage / weight)
#: finite; the API's schema and ``fedtune projects quota`` state and enforce the same.
QUOTA_FIELDS: dict[str, tuple[str, float, float]] = {
    "quota_gpus": ("gpus", 0, 100_000),
    "quota_trials": ("trials", 0, 1_000_000),
    "quota_studies": ("studies", 0, 1_000_000),
    "quota_gpu_hours": ("gpu_hours", 0, 1e9),
    "weight": ("weight", 1e-3, 1e6),
    "max_priority": ("max_priority", 0, 1000),
}
_INTEGER_FIELDS = ("quota_trials", "quota_studies", "max_priority")
TOKEN = re.compile(r"^ftk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")


@dataclass(frozen=True)
class IssuedToken:
    """A new token: ``secret`` is the whole bearer token, shown once and never stored."""

    id: str
    user: str
    secret: str
    expires_at: dt.datetime | None


def _name(field: str, value: str) -> str:
    if not isinstance(value, str) or len(value) > 63 or not NAME.match(value):
        raise InvalidRequestError(
            field, f"must be 1-63 characters of a-z, 0-9 and '-' (not at either end), got {value!r}"
        )
    return value


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_project(session: Session, name: str, owner: str | None = None) -> Project:
    """A new project (409 when it exists)."""
    _name("project", name)
    if session.get(Project, name) is not None:
        raise ConflictError(f"project {name!r} exists")
    project = Project(name=name, owner=owner, weight=1.0, max_priority=0)
    session.add(project)
    session.flush()
    return project


def projects(session: Session) -> list[Project]:
    return list(session.scalars(select(Project).order_by(Project.name)))


def describe_project(project: Project) -> dict:
    """A project's settings as the API and the CLI show them (``null`` quotas: unlimited)."""
    return {
        "name": project.name,
        "owner": project.owner,
        "quota": {
            "gpus": project.quota_gpus,
            "trials": project.quota_trials,
            "studies": project.quota_studies,
            "gpu_hours": project.quota_gpu_hours,
        },
        "weight": project.weight,
        "max_priority": project.max_priority,
        "queue_name": project.queue_name,
    }


def require_project(session: Session, name: str) -> Project:
    project = session.get(Project, name) if isinstance(name, str) else None
    if project is None:
        raise NotFoundError(f"no project {name!r}")
    return project


def set_quota(session: Session, name: str, **values: float | int | None) -> Project:
    """Set a project's settings named in :data:`QUOTA_FIELDS` (only those given; a quota of
    ``None`` is unlimited)."""
    project = require_project(session, name)
    for key, value in values.items():
        _check_quota(key, value)
        setattr(project, key, value)
    session.flush()
    return project


def _check_quota(key: str, value: Any) -> None:
    """Refuse a project setting outside :data:`QUOTA_FIELDS` (the error names the API field).

    Args:
        key: The column, a key of :data:`QUOTA_FIELDS`.
        value: The new value; None (unlimited) only for the three quotas.

    Returns:
        None; raises InvalidRequestError naming the field.
    """
    if key not in QUOTA_FIELDS:
        raise InvalidRequestError(key, "unknown quota field")
    field, least, most = QUOTA_FIELDS[key]
    if value is None:
        if not key.startswith("quota_"):
            raise InvalidRequestError(field, "may not be null")
        return
    integral = key in _INTEGER_FIELDS
    kinds = (int,) if integral else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value):
        raise InvalidRequestError(
            field, f"must be {'an integer' if integral else 'a number'}, got {value!r}"
        )
    if not least <= value <= most:
        raise InvalidRequestError(field, f"must be between {least:g} and {most:g}, got {value!r}")


def create_user(session: Session, name: str, *, admin: bool = False) -> User:
    """A new user (409 when the name is taken)."""
    _name("name", name)
    if session.get(User, name) is not None:
        raise ConflictError(f"user {name!r} exists")
    user = User(name=name, is_admin=admin)
    session.add(user)
    session.flush()
    return user


def add_member(session: Session, user: str, project: str, role: str = "member") -> Membership:
    """Give ``user`` ``role`` in ``project`` (replacing the role it had there)."""
    if role not in ROLES:
        raise InvalidRequestError("role", f"must be one of {', '.join(ROLES)}, got {role!r}")
    if session.get(User, user) is None:
        raise NotFoundError(f"no user {user!r}")
    require_project(session, project)
    found = session.get(Membership, (user, project))
    if found is None:
        found = Membership(user_name=user, project=project, role=role)
        session.add(found)
    else:
        found.role = role
    session.flush()
    return found


def issue_token(
    session: Session, user: str, *, expires_at: dt.datetime | None = None, label: str | None = None
) -> IssuedToken:
    """A new bearer token for ``user`` (its earlier tokens stay valid: rotation)."""
    row = session.get(User, user)
    if row is None or row.disabled_at is not None:
        raise NotFoundError(f"no user {user!r}")
    if expires_at is not None and expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=dt.UTC)
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)  # 32 random bytes
    session.add(
        ApiToken(
            id=token_id,
            user_name=user,
            token_hash=_digest(secret),
            label=label,
            expires_at=expires_at,
        )
    )
    session.flush()
    return IssuedToken(token_id, user, f"ftk_{token_id}_{secret}", expires_at)


def revoke(session: Session, user: str, token_id: str | None = None) -> int:
    """Revoke all of ``user``'s live tokens (or the one ``token_id``); how many were live."""
    if session.get(User, user) is None:
        raise NotFoundError(f"no user {user!r}")
    query = select(ApiToken).where(ApiToken.user_name == user, ApiToken.revoked_at.is_(None))
    if token_id is not None:
        query = query.where(ApiToken.id == token_id)
    now, count = utcnow(), 0
    for row in session.scalars(query):
        row.revoked_at = now
        count += 1
    if token_id is not None and count == 0:
        raise NotFoundError(f"no live token {token_id!r} of user {user!r}")
    session.flush()
    return count


def list_users(session: Session) -> list[dict]:
    """Every user with its roles and live tokens (ids and expiries only)."""
    users = list(session.scalars(select(User).order_by(User.name)))
    roles: dict[str, dict[str, str]] = {}
    for m in session.scalars(select(Membership)):
        roles.setdefault(m.user_name, {})[m.project] = m.role
    now = utcnow()
    tokens: dict[str, list[dict]] = {}
    for t in session.scalars(select(ApiToken).where(ApiToken.revoked_at.is_(None))):
        if t.expires_at is None or t.expires_at > now:
            tokens.setdefault(t.user_name, []).append(
                {"id": t.id, "expires_at": t.expires_at, "label": t.label}
            )
    return [
        {
            "name": u.name,
            "admin": bool(u.is_admin),
            "projects": roles.get(u.name, {}),
            "tokens": tokens.get(u.name, []),
            "created_at": u.created_at,
        }
        for u in users
    ]


def principal_of(session: Session, user: User) -> Principal:
    roles = {
        m.project: m.role
        for m in session.scalars(select(Membership).where(Membership.user_name == user.name))
    }
    return Principal(user.name, bool(user.is_admin), roles)


def principal_for_token(session: Session, token: str) -> Principal | None:
    """The user a bearer token names, or None (malformed, unknown, revoked, expired, disabled)."""
    match = TOKEN.match(token)
    if match is None:
        return None
    row = session.get(ApiToken, match.group(1))
    if row is None or not hmac.compare_digest(row.token_hash, _digest(match.group(2))):
        return None
    if row.revoked_at is not None:
        return None
    if row.expires_at is not None and row.expires_at <= utcnow():
        return None
    user = session.get(User, row.user_name)
    if user is None or user.disabled_at is not None:
        return None
    return principal_of(session, user)
