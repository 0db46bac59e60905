"""Indexes for months of history: keyset paging of the study list, a tick that skips old studies.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25

With thousands of finished studies every query of ``GET /v1/studies``, ``GET /v1/studies/{id}``
and the scheduler's tick must read an index range, not the table (``tests/service/
test_query_plans.py`` checks each plan with ``EXPLAIN`` on PostgreSQL):

* the list is ordered by ``(created_at, id)`` — the keyset of its ``page_token`` — under each
  filter: ``ix_studies_created_at_id`` (no filter), ``ix_studies_state_created_at_id``
  (``state``; also the scheduler's oldest-queued-first scan), ``ix_studies_project_created_at_id``
  (``project``, or the caller's projects) and ``ix_studies_project_state_created_at_id`` (both).
  They replace the ``(state, created_at)`` and ``(project, state, created_at)`` indexes of
  revisions 0002 and 0004, which lacked the ``id`` tie-break (a sort per page);
* ``ix_studies_finished_at``: the fair-share window (studies finished in the last
  ``FEDTUNE_FAIR_SHARE_WINDOW_S``) reads a range instead of every finished study;
* ``ix_studies_driver_held``: a partial index over the studies that still hold a driver
  reference (running ones and final ones not yet released), so releasing finished RayJobs
  never scans the finished history.

Studies whose ``project`` is NULL (none should exist after 0004, which filled it in) move to
``default``: the list filters ``project IN (...)`` on the index instead of ``coalesce(project,
'default')``, which no index serves.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# revisions are frozen: this equals fedtune.service.models.DEFAULT_PROJECT
DEFAULT_PROJECT = "default"
HELD = "driver_ref IS NOT NULL"


def upgrade() -> None:
    op.execute(f"UPDATE studies SET project = '{DEFAULT_PROJECT}' WHERE project IS NULL")
    op.drop_index("ix_studies_state_created_at", table_name="studies")
    op.drop_index("ix_studies_project_state_created_at", table_name="studies")
    op.create_index("ix_studies_created_at_id", "studies", ["created_at", "id"])
    op.create_index("ix_studies_state_created_at_id", "studies", ["state", "created_at", "id"])
    op.create_index("ix_studies_project_created_at_id", "studies", ["project", "created_at", "id"])
    op.create_index(
        "ix_studies_project_state_created_at_id",
        "studies",
        ["project", "state", "created_at", "id"],
    )
    op.create_index("ix_studies_finished_at", "studies", ["finished_at"])
    op.create_index(
        "ix_studies_driver_held",
        "studies",
        ["backend", "updated_at", "id"],
        postgresql_where=sa.text(HELD),
        sqlite_where=sa.text(HELD),
    )


def downgrade() -> None:
    for name in (
        "ix_studies_driver_held",
        "ix_studies_finished_at",
        "ix_studies_project_state_created_at_id",
        "ix_studies_project_created_at_id",
        "ix_studies_state_created_at_id",
        "ix_studies_created_at_id",
    ):
        op.drop_index(name, table_name="studies")
    op.create_index(
        "ix_studies_project_state_created_at", "studies", ["project", "state", "created_at"]
    )
    op.create_index("ix_studies_state_created_at", "studies", ["state", "created_at"])
