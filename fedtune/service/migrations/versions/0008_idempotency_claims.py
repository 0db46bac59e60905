"""The submissions being checked, by Idempotency-Key: one check per submission.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29

* ``idempotency_claims``: the first request with a key inserts its row before the check of its
  spec (the sandboxed check of uploaded code may take ``FEDTUNE_CODE_CHECK_TIMEOUT_S``); a retry
  with the same key finds the row and waits for that check's answer instead of starting another
  (``fedtune.service.idempotency``). ``answer`` keeps a refusal for the retries; ``claimed_at`` is
  indexed so that old rows are swept.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_claims",
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("answer", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("key", name="pk_idempotency_claims"),
    )
    op.create_index("ix_idempotency_claims_claimed_at", "idempotency_claims", ["claimed_at"])


def downgrade() -> None:
    op.drop_index("ix_idempotency_claims_claimed_at", table_name="idempotency_claims")
    op.drop_table("idempotency_claims")
