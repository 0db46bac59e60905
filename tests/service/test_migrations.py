"""Migrations are product: upgrade a stored older database, and models match the revisions."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from fedtune.service import tickets
from fedtune.service.db import Database
from fedtune.service.migrate import (
    ALEMBIC_INI,
    MIGRATIONS_DIR,
    current_revision,
    head_revision,
    upgrade_database,
)
from fedtune.service.models import BOOTSTRAP_ADMIN, DEFAULT_PROJECT, Base, Project, User
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState

OLD_ROWS = {
    "studies": {
        "id": "0123456789ab",
        "name": "old",
        "state": "running",
        "spec": json.dumps({"name": "old"}),
        "algorithm": "fedavg",
        "task": "quadratic",
        "trials_requested": 3,
        "backend": "local",
        "driver_ref": json.dumps({"pid": 1}),
        "attempts": 1,
        "created_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
        "updated_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    },
    "trials": {
        "study_id": "0123456789ab",
        "number": 0,
        "state": "completed",
        "params": json.dumps({"hparams.client_lr": 0.1}),
        "value": 0.5,
        "last_round": 2,
        "started_at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    },
}


def _insert(db: Database, table: str, row: dict) -> None:
    cols = ", ".join(row)
    params = ", ".join(f":{k}" for k in row)
    with db.engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} ({cols}) VALUES ({params})"), row)


def test_the_package_ships_its_alembic_files() -> None:
    assert ALEMBIC_INI.is_file() and (MIGRATIONS_DIR / "env.py").is_file()
    assert (MIGRATIONS_DIR / "script.py.mako").is_file()
    assert len(list((MIGRATIONS_DIR / "versions").glob("*.py"))) >= 2
    assert head_revision() == "0010"


def test_upgrade_a_stored_older_database(database_at_0001: Database) -> None:
    db = database_at_0001
    _insert(db, "studies", OLD_ROWS["studies"])
    _insert(db, "trials", OLD_ROWS["trials"])
    with db.engine.begin() as conn:
        trial_id = conn.execute(text("SELECT id FROM trials")).scalar_one()
        conn.execute(
            text("INSERT INTO trial_rounds (trial_id, round, metrics) VALUES (:t, 1, :m)"),
            {"t": trial_id, "m": json.dumps({"client_loss": 1.0})},
        )
    assert "heartbeat_at" not in {c["name"] for c in inspect(db.engine).get_columns("studies")}

    assert upgrade_database(db) == "0010"
    assert upgrade_database(db) == "0010"  # idempotent

    indexes = {ix["name"] for ix in inspect(db.engine).get_indexes("studies")}
    assert "ix_studies_state_created_at_id" in indexes  # revision 0005 (keyset order)
    with db.session() as s:
        repo = Repository(s)
        study = repo.require_study("0123456789ab")
        assert study.state == StudyState.RUNNING and study.spec == {"name": "old"}
        assert study.driver_ref == {"pid": 1} and study.heartbeat_at is None
        assert study.code_sha256 is None  # revision 0003: built-in code only
        # revision 0004: existing studies belong to `default`, owned by the bootstrap admin
        assert study.project == DEFAULT_PROJECT and study.priority == 0
        assert study.reserved_gpus == 0.0 and study.dispatch_token is None
        project = s.get(Project, DEFAULT_PROJECT)
        assert project is not None and project.owner == BOOTSTRAP_ADMIN
        admin = s.get(User, BOOTSTRAP_ADMIN)
        assert admin is not None and admin.is_admin and admin.disabled_at is None
        assert study.created_at == dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        [trial] = repo.list_trials("0123456789ab")
        assert trial.state == TrialState.COMPLETED and trial.value == 0.5
        assert [r.metrics for r in repo.curve("0123456789ab", 0)] == [{"client_loss": 1.0}]
        repo.update_study("0123456789ab", heartbeat_at=dt.datetime(2026, 2, 1, tzinfo=dt.UTC))
    with db.session(readonly=True) as s:
        beat = Repository(s).require_study("0123456789ab").heartbeat_at
        assert beat == dt.datetime(2026, 2, 1, tzinfo=dt.UTC)
    # revision 0010: the study of before has no start ticket, and gets one at its next dispatch
    with db.session() as s:
        assert tickets.events(s, "0123456789ab") == []
        ticket = tickets.issue(s, "0123456789ab", 2, ttl_s=600)
    assert tickets.redeem(db, "0123456789ab", ticket).attempt == 2


def test_models_match_the_revisions(database: Database) -> None:
    """What the revisions build is what the models describe (no autogenerate diff)."""
    with database.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []
    assert current_revision(database.engine) == head_revision()


@pytest.fixture
def database_at_0001(db_url: str, tmp_path: Path):
    db = Database(db_url)
    assert upgrade_database(db, "0001") == "0001"
    yield db
    db.dispose()


def test_revision_0005_fills_null_projects_and_swaps_indexes(db_url: str) -> None:
    """The list filters ``project IN (...)`` on an index (no coalesce()), so a
    study left without a project moves to ``default``; the keyset indexes replace the old ones,
    and the downgrade puts those back."""
    from alembic import command

    from fedtune.service.migrate import alembic_config

    db = Database(db_url)
    try:
        assert upgrade_database(db, "0004") == "0004"
        _insert(db, "studies", OLD_ROWS["studies"])  # no project: NULL
        assert upgrade_database(db) == "0010"
        indexes = {ix["name"] for ix in inspect(db.engine).get_indexes("studies")}
        assert {
            "ix_studies_created_at_id",
            "ix_studies_project_created_at_id",
            "ix_studies_project_state_created_at_id",
            "ix_studies_finished_at",
            "ix_studies_driver_held",
        } <= indexes
        assert "ix_studies_project_state_created_at" not in indexes
        with db.session(readonly=True) as s:
            assert Repository(s).require_study("0123456789ab").project == DEFAULT_PROJECT
            page = Repository(s).page_studies(projects=[DEFAULT_PROJECT])
            assert [st.id for st in page] == ["0123456789ab"]

        cfg = alembic_config()
        with db.engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0004")
        indexes = {ix["name"] for ix in inspect(db.engine).get_indexes("studies")}
        assert {"ix_studies_state_created_at", "ix_studies_project_state_created_at"} <= indexes
        assert "ix_studies_created_at_id" not in indexes
        assert upgrade_database(db) == "0010"
    finally:
        db.dispose()
