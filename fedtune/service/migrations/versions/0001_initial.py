"""Initial schema: studies, trials, trial_rounds, idempotency_keys.

Revision ID: 0001
Revises:
Create Date: 2026-09-01

Frozen: this revision spells out its columns instead of importing the models, so later model
changes never rewrite history.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "studies",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("algorithm", sa.String(64), nullable=False),
        sa.Column("task", sa.String(64), nullable=False),
        sa.Column("trials_requested", sa.Integer(), nullable=False),
        sa.Column("backend", sa.String(16), nullable=True),
        sa.Column("driver_ref", sa.JSON(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("mlflow_experiment_id", sa.String(64), nullable=True),
        sa.Column("mlflow_run_id", sa.String(64), nullable=True),
        sa.Column("best_trial", sa.Integer(), nullable=True),
        sa.Column("best_value", sa.Float(), nullable=True),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
        sa.Column("started_at", TS, nullable=True),
        sa.Column("finished_at", TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_studies"),
    )
    op.create_index("ix_studies_state", "studies", ["state"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("study_id", sa.String(32), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("value", sa.Float(), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.Column("last_round", sa.Integer(), nullable=False),
        sa.Column("mlflow_run_id", sa.String(64), nullable=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
        sa.ForeignKeyConstraint(
            ["study_id"], ["studies.id"], name="fk_trials_study_id_studies", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_trials"),
        sa.UniqueConstraint("study_id", "number", name="uq_trials_study_number"),
    )
    op.create_index("ix_trials_study_id", "trials", ["study_id"])
    op.create_table(
        "trial_rounds",
        sa.Column("trial_id", sa.Integer(), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trial_id"], ["trials.id"], name="fk_trial_rounds_trial_id_trials", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("trial_id", "round", name="pk_trial_rounds"),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("study_id", sa.String(32), nullable=False),
        sa.Column("created_at", TS, nullable=False),
        sa.ForeignKeyConstraint(
            ["study_id"],
            ["studies.id"],
            name="fk_idempotency_keys_study_id_studies",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key", name="pk_idempotency_keys"),
    )


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_table("trial_rounds")
    op.drop_index("ix_trials_study_id", table_name="trials")
    op.drop_table("trials")
    op.drop_index("ix_studies_state", table_name="studies")
    op.drop_table("studies")
