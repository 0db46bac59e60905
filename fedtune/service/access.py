"""Who may do what: the caller and its rights on a project.

A study — its trials, curves, trade-off, logs, code package and artifacts — belongs to the
study's project. :class:`Principal` is the authenticated caller: ``admin`` may do everything;
otherwise a ``member`` of a project may submit, read and cancel its studies and a ``viewer`` may
read them. A caller who may not *read* a study gets **404**, exactly as for a study that does
not exist (no existence oracle, as Kubeflow Profiles hide other namespaces); a viewer who may
read it but not change it gets 403. Lists hold only what the caller may read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from fedtune.errors import ForbiddenError, InvalidRequestError, StudyNotFoundError

from .models import DEFAULT_PROJECT, Study

__all__ = ["ANONYMOUS_ADMIN", "Principal", "default_project", "require_study_access"]


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its name, the admin flag and its role per project."""

    name: str
    admin: bool = False
    roles: Mapping[str, str] = field(default_factory=dict)
    #: how it authenticated: ``token`` (a user's API token), ``bootstrap`` (FEDTUNE_API_TOKEN),
    #: ``oidc`` (an identity provider's JWT) or ``open`` (no authentication configured)
    via: str = "token"

    def can_read(self, project: str | None) -> bool:
        return self.admin or (project or DEFAULT_PROJECT) in self.roles

    def can_write(self, project: str | None) -> bool:
        return self.admin or self.roles.get(project or DEFAULT_PROJECT) == "member"

    def writable(self) -> list[str] | None:
        """The projects it may submit to; ``None``: all of them (an admin)."""
        return None if self.admin else sorted(p for p, r in self.roles.items() if r == "member")

    def readable(self) -> list[str] | None:
        """The projects whose studies it may read; ``None``: all of them (an admin)."""
        return None if self.admin else sorted(self.roles)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "admin": self.admin,
            "projects": dict(self.roles),
            "via": self.via,
        }


#: the caller of a service without authentication (no FEDTUNE_API_TOKEN): a local, one-user
#: service, as before users existed
ANONYMOUS_ADMIN = Principal("anonymous", admin=True, via="open")


def default_project(caller: Principal) -> str:
    """The project of a submission (and of its code upload) that names none.

    An admin's — the caller of an open service, the bootstrap token — is ``default``, as
    before projects existed; a member of exactly one project submits there.

    Args:
        caller: who submits.

    Returns:
        The project's name; a caller who may submit to several projects, or to none, gets
        ``InvalidRequestError`` (422, field ``project``) listing those it may submit to.
    """
    writable = caller.writable()
    if writable is None:
        return DEFAULT_PROJECT
    if len(writable) == 1:
        return writable[0]
    if not writable:
        raise InvalidRequestError(
            "project",
            f"{caller.name} may submit to no project (a "
            "member of none): ask an admin to make you a member of one",
        )
    raise InvalidRequestError(
        "project",
        f"{caller.name} may submit to several projects: name "
        f"one with project: ({', '.join(writable)})",
    )


def require_study_access(
    session: Session, caller: Principal, study_id: str, write: bool = False
) -> str:
    """The study's project if ``caller`` may read it (``write``: change it); else
    ``StudyNotFoundError`` (404, as if it did not exist) or, for a reader who may not change
    it, ``ForbiddenError`` (403)."""
    row = session.execute(select(Study.id, Study.project).where(Study.id == study_id)).first()
    project = row.project if row is not None else None
    if row is None or not caller.can_read(project):
        raise StudyNotFoundError(f"no study {study_id!r}")
    if write and not caller.can_write(project):
        raise ForbiddenError(
            f"{caller.name} may read but not change the studies of project "
            f"{project or DEFAULT_PROJECT!r} (viewer)"
        )
    return project or DEFAULT_PROJECT
