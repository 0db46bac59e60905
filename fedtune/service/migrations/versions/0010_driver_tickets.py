"""One-time start tickets of study drivers.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28

* ``driver_tickets``: one row per ticket the scheduler issues with a dispatch attempt
  (``fedtune.service.tickets``): its study and attempt, the SHA-256 of the ticket, when it
  expires, when it was redeemed and the SHA-256 of the driver credential it was exchanged for,
  and when a second redemption marked the attempt compromised. No ticket or credential is
  stored, only their digests.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "driver_tickets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("ticket_hash", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("redeemed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("compromised_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["studies.id"],
            name="fk_driver_tickets_study_id_studies",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_driver_tickets"),
        sa.UniqueConstraint("ticket_hash", name="uq_driver_tickets_ticket_hash"),
        sa.UniqueConstraint("token_hash", name="uq_driver_tickets_token_hash"),
    )
    op.create_index("ix_driver_tickets_study_id_attempt", "driver_tickets", ["study_id", "attempt"])


def downgrade() -> None:
    op.drop_index("ix_driver_tickets_study_id_attempt", table_name="driver_tickets")
    op.drop_table("driver_tickets")
