"""A project's quota in GPU-hours over the fair-share window.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27

* ``projects.quota_gpu_hours``: the GPU-hours a project's studies may use or still hold within
  ``FEDTUNE_FAIR_SHARE_WINDOW_S`` (NULL: unlimited); admission charges a queued study
  ``GPUs × budget.time`` (``fedtune.service.admission``).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("projects", sa.Column("quota_gpu_hours", sa.Float(), nullable=True))


def downgrade() -> None:
    # a plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): a batch copy of ``projects`` would
    # drop a table that memberships, tokens and studies reference
    op.drop_column("projects", "quota_gpu_hours")
