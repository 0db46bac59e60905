"""Identity and projects: ``/v1/whoami``, the admin-only ``/v1/users`` and ``/v1/projects``
(the same as ``fedtune users …`` / ``fedtune projects …`` on the database).

A non-admin calling an admin-only route gets 403 (the route is public in the OpenAPI document;
nothing about any user or project is told). ``GET /v1/projects`` lists the projects the caller
belongs to; ``GET /v1/projects/{p}`` answers 404 to a caller who is not in ``p``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from fedtune.errors import ForbiddenError, NotFoundError
from fedtune.wire_models import (
    Identity,
    MembershipOut,
    MlflowLoginOut,
    ProjectDetail,
    ProjectOut,
    Revoked,
    TokenOut,
    UserOut,
)

from .. import identity
from ..access import Principal
from ..admin_db import DatabaseAdmin
from ..schemas import ErrorResponse
from .auth import Caller
from .deps import Ctx

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["identity"])
Name = Annotated[str, Path(max_length=63)]
_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"model": ErrorResponse, "description": "admins only"},
    404: {"model": ErrorResponse, "description": "no such user or project"},
}
_TAKEN: dict[int | str, dict[str, Any]] = {
    **_ERRORS,
    409: {"model": ErrorResponse, "description": "the name is taken"},
}
#: a user's or a project's name, as :func:`fedtune.service.identity.create_user` checks it
NAME_PATTERN = identity.NAME.pattern
Role = Literal["member", "viewer"]
#: free text stored in a column: no control characters (PostgreSQL refuses NUL)
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]*$"


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


def _setting(column: str, description: str, *, nullable: bool) -> Any:
    """A project setting's field, bounded as :data:`fedtune.service.identity.QUOTA_FIELDS`.

    Args:
        column: The setting's column in the ``projects`` table.
        description: What the setting is, for the OpenAPI document.
        nullable: Whether ``null`` (unlimited) is accepted.

    Returns:
        A pydantic ``Field``: strict (a bool is no number), finite, within the bounds.
    """
    _, least, most = identity.QUOTA_FIELDS[column]
    extra = None if nullable else _no_default  # left out keeps the value; null is no value
    return Field(
        None,
        strict=True,
        ge=least,
        le=most,
        allow_inf_nan=False,
        description=description,
        json_schema_extra=extra,
    )


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UserIn(_In):
    name: str = Field(max_length=63, pattern=NAME_PATTERN)
    project: str | None = Field(
        None, max_length=63, pattern=NAME_PATTERN, description="a first project to join"
    )
    role: Role = Field("member", description="member (submit, read, cancel) or viewer (read)")
    admin: bool = Field(False, strict=True)
    expires_in_days: float | None = Field(
        None, strict=True, gt=0, le=3650, description="token lifetime"
    )


class TokenIn(_In):
    expires_in_days: float | None = Field(None, strict=True, gt=0, le=3650)
    label: str | None = Field(None, max_length=64, pattern=TEXT_PATTERN)


class RevokeIn(_In):
    token_id: str | None = Field(
        None, max_length=24, pattern=TEXT_PATTERN, description="one token; all when left out"
    )


class RoleIn(_In):
    role: Role = Field(description="member (submit, read, cancel) or viewer (read)")


class ProjectIn(_In):
    name: str = Field(max_length=63, pattern=NAME_PATTERN)


class QuotaIn(_In):
    """A project's quotas (``null``: unlimited), fair-share weight and highest priority."""

    gpus: float | None = _setting(
        "quota_gpus", "GPUs its studies may reserve at once", nullable=True
    )
    trials: int | None = _setting("quota_trials", "concurrent trials", nullable=True)
    studies: int | None = _setting(
        "quota_studies", "active (queued or running) studies", nullable=True
    )
    gpu_hours: float | None = _setting(
        "quota_gpu_hours",
        "GPU-hours its studies may use or hold within the fair-share window",
        nullable=True,
    )
    weight: float = _setting("weight", "fair-share weight", nullable=False)
    max_priority: int = _setting(
        "max_priority", "the highest priority its studies may ask for", nullable=False
    )


def _admin(caller: Principal) -> None:
    if not caller.admin:
        raise ForbiddenError("only an admin may do this")


def _admin_db(ctx: Any) -> DatabaseAdmin:
    """What the routes below do once their caller may: ``fedtune users``' own code."""
    return DatabaseAdmin(ctx.db, ctx.settings)


def _poke(ctx: Any) -> None:
    """Sync MLflow's users and roles soon (no-op without MLflow workspaces)."""
    if ctx.tenancy is not None:
        ctx.tenancy.poke()


@router.post(
    "/users/{name}/mlflow-login", status_code=201, response_model=MlflowLoginOut, responses=_ERRORS
)
def mlflow_login(ctx: Ctx, caller: Caller, name: Name) -> MlflowLoginOut:
    """A new password of ``name``'s MLflow UI login (an admin, or the user for itself).

    404 when the service keeps no MLflow workspaces (``FEDTUNE_MLFLOW_WORKSPACES``). The
    user's MLflow roles follow its fedtune roles (for an OIDC caller: its groups now).
    """
    if not caller.admin and caller.name != name:
        raise ForbiddenError("only an admin may make an MLflow login for another user")
    if ctx.tenancy is None:
        raise NotFoundError("this service keeps no MLflow workspaces")
    if not ctx.tenancy.tenancy.manages(name):  # never MLflow's admin or a driver's login
        raise ForbiddenError(f"{name!r} has no MLflow login of its own")
    from ..mlflow_workspaces import workspace_for

    if caller.name == name and caller.via == "oidc":
        roles, admins = {name: dict(caller.roles)}, [name] if caller.admin else []
    else:
        with ctx.db.session(readonly=True) as session:
            user = next((u for u in identity.list_users(session) if u["name"] == name), None)
        if user is None:
            raise NotFoundError(f"no user {name!r}")
        roles, admins = {name: dict(user["projects"])}, [name] if user["admin"] else []
    ctx.tenancy.sync_user(name, roles[name], admin=bool(admins))
    password = ctx.tenancy.tenancy.issue_password(name)  # a fresh one; the old one ends
    workspaces = sorted(workspace_for(p) for p in roles[name])
    return MlflowLoginOut(user=name, workspaces=workspaces, password=password)


@router.get("/whoami", response_model=Identity)
def whoami(caller: Caller) -> Identity:
    """Who the bearer token is: name, admin, role per project, how it authenticated."""
    return Identity(**caller.to_dict())


@router.get("/users", response_model=list[UserOut], responses=_ERRORS)
def list_users(ctx: Ctx, caller: Caller) -> list[UserOut]:
    """Every user with its roles and live token ids (admins only)."""
    _admin(caller)
    return _admin_db(ctx).users()


@router.post("/users", status_code=201, response_model=TokenOut, responses=_TAKEN)
def create_user(ctx: Ctx, caller: Caller, body: UserIn) -> TokenOut:
    """A user (optionally a member or viewer of a first project) and its first token."""
    _admin(caller)
    issued = _admin_db(ctx).create_user(
        body.name,
        body.project,
        body.role,
        admin=body.admin,
        expires_in_days=body.expires_in_days,
    )
    _poke(ctx)
    return issued


@router.post("/users/{name}/tokens", status_code=201, response_model=TokenOut, responses=_ERRORS)
def new_token(ctx: Ctx, caller: Caller, name: Name, body: TokenIn) -> TokenOut:
    """Another token for ``name`` (rotation): an admin, or the user for itself."""
    if not caller.admin and caller.name != name:
        raise ForbiddenError("only an admin may make tokens for another user")
    return _admin_db(ctx).new_token(name, body.expires_in_days, label=body.label)


@router.post("/users/{name}/revoke", response_model=Revoked, responses=_ERRORS)
def revoke(ctx: Ctx, caller: Caller, name: Name, body: RevokeIn) -> Revoked:
    """Revoke all of ``name``'s live tokens, or one (admins only)."""
    _admin(caller)
    revoked = _admin_db(ctx).revoke(name, body.token_id)
    _poke(ctx)
    return Revoked(revoked=revoked)


@router.put("/users/{name}/projects/{project}", response_model=MembershipOut, responses=_ERRORS)
def set_role(ctx: Ctx, caller: Caller, name: Name, project: Name, body: RoleIn) -> MembershipOut:
    """Give ``name`` a role in ``project`` (admins only)."""
    _admin(caller)
    membership = _admin_db(ctx).set_role(name, project, body.role)
    _poke(ctx)
    return membership


@router.get("/projects", response_model=list[ProjectOut], responses=_ERRORS)
def list_projects(ctx: Ctx, caller: Caller) -> list[ProjectOut]:
    """The projects the caller belongs to (an admin: all), with quotas."""
    return [p for p in _admin_db(ctx).projects() if caller.can_read(p.name)]


@router.post("/projects", status_code=201, response_model=ProjectOut, responses=_TAKEN)
def create_project(ctx: Ctx, caller: Caller, body: ProjectIn) -> ProjectOut:
    """A new project, without quotas (admins only)."""
    _admin(caller)
    described = _admin_db(ctx).create_project(body.name)
    if ctx.tenancy is not None:  # its MLflow workspace is made with it
        ctx.tenancy.ensure(body.name)
    return described


@router.get("/projects/{project}", response_model=ProjectDetail, responses=_ERRORS)
def get_project(ctx: Ctx, caller: Caller, project: Name) -> ProjectDetail:
    """A project's quota and its usage now (404 unless the caller is in it)."""
    if not caller.can_read(project):
        raise NotFoundError(f"no project {project!r}")
    return _admin_db(ctx).project(project)


@router.put("/projects/{project}/quota", response_model=ProjectOut, responses=_ERRORS)
def set_quota(ctx: Ctx, caller: Caller, project: Name, body: QuotaIn) -> ProjectOut:
    """Set the quotas given (``null``: unlimited; a field left out keeps its value)."""
    _admin(caller)
    return _admin_db(ctx).set_quota(project, **body.model_dump(exclude_unset=True))
