"""Driver heartbeats and the (state, created_at) index of the study list and the scheduler.

Revision ID: 0002
Revises: 0001
Create Date: 2026-09-02

* ``studies.heartbeat_at``: the study driver stamps it every ``FEDTUNE_HEARTBEAT_S`` seconds, so
  ``GET /v1/studies/{id}`` shows when the driver last spoke and reconciliation can tell a
  silent driver from a busy one. Existing rows get NULL (never heard from).
* ``ix_studies_state_created_at``: the scheduler's "oldest queued first" scan and
  ``GET /v1/studies?state=…`` (ordered by creation) read it instead of sorting the table.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("studies", sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_studies_state_created_at", "studies", ["state", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_studies_state_created_at", table_name="studies")
    with op.batch_alter_table("studies") as batch:
        batch.drop_column("heartbeat_at")
