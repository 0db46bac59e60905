"""A project remembers its MLflow workspace.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-28

* ``projects.mlflow_workspace``: the MLflow workspace the service made for the project
  (``fedtune.service.mlflow_records``); NULL: none. ``fedtune serve`` refuses to start without
  an MLflow server on a database where a project has one, instead of serving its members
  without their runs' links and logins.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("projects", sa.Column("mlflow_workspace", sa.String(length=64), nullable=True))


def downgrade() -> None:
    # a plain ALTER TABLE ... DROP COLUMN, as 0007's downgrade (no batch copy of ``projects``)
    op.drop_column("projects", "mlflow_workspace")
