"""Studies of methods: the studies one submission queued, compared once they have all ended.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25

* ``method_groups``: one row per ``POST /v1/methods``: its name, project and study ids;
  ``claimed_at`` (compare-and-set by the scheduler tick that records the comparison, so exactly
  one records it) and ``comparison`` (the MLflow run recorded, or why there is none).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "method_groups",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("study_ids", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("comparison", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(
            ["project"],
            ["projects.name"],
            name="fk_method_groups_project_projects",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_method_groups"),
    )
    op.create_index("ix_method_groups_claimed_at", "method_groups", ["claimed_at"])


def downgrade() -> None:
    op.drop_index("ix_method_groups_claimed_at", table_name="method_groups")
    op.drop_table("method_groups")
