"""Uploaded user code: the ``code_packages`` table and ``studies.code_sha256``.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

* ``code_packages``: a study's ``code:`` package (a zip, ``fedtune.code_package``) keyed by its
  SHA-256, in the service's own database, so a restarted service or a re-dispatched driver on
  another machine finds it (SQLite ``BLOB``, PostgreSQL ``bytea``); identical code is one row;
* ``studies.code_sha256``: the package a study runs with (NULL: built-in code only). Existing
  studies get NULL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "code_packages",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name="pk_code_packages"),
    )
    op.add_column("studies", sa.Column("code_sha256", sa.String(64), nullable=True))
    op.create_index("ix_studies_code_sha256", "studies", ["code_sha256"])


def downgrade() -> None:
    op.drop_index("ix_studies_code_sha256", table_name="studies")
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("code_sha256")
    op.drop_table("code_packages")
