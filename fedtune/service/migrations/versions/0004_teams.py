"""A service a team shares: users, projects, tokens, ownership, quotas and the scheduler lease.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

* ``projects``: the unit of ownership and of quota (Kubeflow's profile, Kueue's LocalQueue).
  ``quota_gpus``/``quota_trials``/``quota_studies`` cap what the project's running studies may
  reserve together (NULL: no cap); ``weight`` is its fair-share weight; ``max_priority`` bounds
  the ``priority:`` of its studies; ``queue_name`` the Kueue LocalQueue its RayJobs join (NULL:
  the project's name).
* ``users``: ``is_admin`` users may do everything; ``disabled_at`` revokes a user with all tokens.
* ``memberships``: per project, ``member`` (submit, read, cancel) or ``viewer`` (read only).
* ``api_tokens``: per-user bearer tokens stored only as a SHA-256 of the secret (the secret has
  ≥ 32 random bytes, so a plain hash is not guessable); ``id`` is the token's public prefix;
  optional ``expires_at``; ``revoked_at`` revokes one token.
* ``code_package_owners``: which projects uploaded a package (the bytes stay stored once).
* ``studies.project``/``owner``/``priority``/``reserved_gpus``/``reserved_trials``/
  ``queued_reason``/``dispatch_token``: the study's project and submitter, its priority, what it
  reserves while running (``max_concurrent`` × per-trial resources), why it still waits, and the
  scheduler lease's fencing token it was dispatched under.
* ``scheduler_lease``: one row per lease (``scheduler``); the holder, a fencing token that only
  grows, and when the lease runs out.

Existing studies and packages move to the ``default`` project, owned by the bootstrap admin
(``admin``, the user ``FEDTUNE_API_TOKEN`` authenticates as).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# revisions are frozen: these equal fedtune.service.models.DEFAULT_PROJECT / BOOTSTRAP_ADMIN
DEFAULT_PROJECT = "default"
BOOTSTRAP_ADMIN = "admin"


def _now() -> sa.TextClause:
    return sa.text("CURRENT_TIMESTAMP")


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_users"),
    )
    op.create_table(
        "projects",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(64), nullable=True),
        sa.Column("quota_gpus", sa.Float(), nullable=True),
        sa.Column("quota_trials", sa.Integer(), nullable=True),
        sa.Column("quota_studies", sa.Integer(), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("max_priority", sa.Integer(), nullable=False),
        sa.Column("queue_name", sa.String(63), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner"], ["users.name"], name="fk_projects_owner_users", ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("name", name="pk_projects"),
    )
    op.create_table(
        "memberships",
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_name"], ["users.name"], name="fk_memberships_user_name_users", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
            name="fk_memberships_project_projects",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("user_name", "project", name="pk_memberships"),
    )
    op.create_index("ix_memberships_project", "memberships", ["project"])
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(24), nullable=False),
        sa.Column("user_name", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("label", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["user_name"], ["users.name"], name="fk_api_tokens_user_name_users", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
    )
    op.create_index("ix_api_tokens_user_name", "api_tokens", ["user_name"])
    op.create_table(
        "code_package_owners",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["sha256"],
            ["code_packages.sha256"],
            name="fk_code_package_owners_sha256_code_packages",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
            name="fk_code_package_owners_project_projects",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("sha256", "project", name="pk_code_package_owners"),
    )
    op.create_table(
        "scheduler_lease",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("holder", sa.String(128), nullable=True),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("renewed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_scheduler_lease"),
    )

    users = sa.table("users", *(sa.column(c) for c in ("name", "is_admin", "created_at")))
    projects = sa.table(
        "projects",
        *(sa.column(c) for c in ("name", "owner", "weight", "max_priority", "created_at")),
    )
    op.execute(users.insert().values(name=BOOTSTRAP_ADMIN, is_admin=True, created_at=_now()))
    op.execute(
        projects.insert().values(
            name=DEFAULT_PROJECT,
            owner=BOOTSTRAP_ADMIN,
            weight=1.0,
            max_priority=0,
            created_at=_now(),
        )
    )
    op.execute(
        "INSERT INTO code_package_owners (sha256, project, created_at) "
        f"SELECT sha256, '{DEFAULT_PROJECT}', created_at FROM code_packages"
    )

    # Plain ADD COLUMNs, no batch: SQLite's batch mode copies and DROPs ``studies``, and the drop
    # cascades to ``trials`` (ON DELETE CASCADE, foreign keys on). SQLite adds a REFERENCES column
    # only with a NULL default, so ``project`` is nullable and filled in after; the service always
    # sets it.
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE studies ADD COLUMN project VARCHAR(64) "
            "CONSTRAINT fk_studies_project_projects REFERENCES projects (name)"
        )
    else:
        op.add_column("studies", sa.Column("project", sa.String(64), nullable=True))
        op.create_foreign_key(
            "fk_studies_project_projects", "studies", "projects", ["project"], ["name"]
        )
    op.add_column("studies", sa.Column("owner", sa.String(64), nullable=True))
    op.add_column(
        "studies", sa.Column("priority", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "studies", sa.Column("reserved_gpus", sa.Float(), nullable=False, server_default="0")
    )
    op.add_column(
        "studies", sa.Column("reserved_trials", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("studies", sa.Column("queued_reason", sa.Text(), nullable=True))
    op.add_column("studies", sa.Column("dispatch_token", sa.BigInteger(), nullable=True))
    op.execute(f"UPDATE studies SET project = '{DEFAULT_PROJECT}'")
    op.create_index(
        "ix_studies_project_state_created_at", "studies", ["project", "state", "created_at"]
    )


def downgrade() -> None:
    op.drop_index("ix_studies_project_state_created_at", table_name="studies")
    with op.batch_alter_table("studies") as batch:
        batch.drop_constraint("fk_studies_project_projects", type_="foreignkey")
        for column in (
            "dispatch_token",
            "queued_reason",
            "reserved_trials",
            "reserved_gpus",
            "priority",
            "owner",
            "project",
        ):
            batch.drop_column(column)
    op.drop_table("scheduler_lease")
    op.drop_table("code_package_owners")
    op.drop_index("ix_api_tokens_user_name", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_index("ix_memberships_project", table_name="memberships")
    op.drop_table("memberships")
    op.drop_table("projects")
    op.drop_table("users")
