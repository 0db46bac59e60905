"""`fedtune db upgrade` migrates; a service started with FEDTUNE_MIGRATE_ON_START=false refuses an
old schema with one line (migrations run once, in the chart's hook Job)."""

from __future__ import annotations

import pytest

from fedtune.cli import main
from fedtune.service.api.app import Runtime
from fedtune.service.db import Database
from fedtune.service.migrate import (
    SchemaOutdatedError,
    current_revision,
    head_revision,
    upgrade_database,
)


def test_db_upgrade_brings_an_empty_database_to_head(db_url: str, capsys) -> None:
    assert main(["db", "current", "--database-url", db_url]) == 1
    assert main(["db", "upgrade", "--database-url", db_url]) == 0
    assert f"database at revision {head_revision()}" in capsys.readouterr().out
    db = Database(db_url)
    try:
        assert current_revision(db.engine) == head_revision()
    finally:
        db.dispose()
    assert main(["db", "upgrade", "--database-url", db_url]) == 0  # idempotent
    assert main(["db", "current", "--database-url", db_url]) == 0


def test_db_upgrade_reads_the_url_from_the_environment(db_url, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FEDTUNE_DATABASE_URL", db_url)
    assert main(["db", "upgrade"]) == 0
    assert head_revision() in capsys.readouterr().out


def test_serve_refuses_an_old_schema_with_one_line(db_url, monkeypatch, capsys) -> None:
    """With migrations left to the hook Job, `fedtune serve` neither migrates nor starts."""
    import uvicorn

    def _serve(*_a, **_k) -> None:
        raise AssertionError("the service started on an old schema")

    monkeypatch.setattr(uvicorn, "run", _serve)
    monkeypatch.setenv("FEDTUNE_MIGRATE_ON_START", "false")
    db = Database(db_url)
    try:
        upgrade_database(db, "0001")
        code = main(["serve", "--database-url", db_url, "--backend", "none"])
        err = capsys.readouterr().err
        assert code == 1
        assert err.count("\n") == 1, err
        assert "revision 0001" in err and "fedtune db upgrade" in err
        assert current_revision(db.engine) == "0001"  # the service did not migrate it
    finally:
        db.dispose()


def test_runtime_refuses_an_empty_database_when_not_migrating(make_settings) -> None:
    settings = make_settings(migrate_on_start=False)
    with pytest.raises(SchemaOutdatedError, match=r"none \(empty database\).*fedtune db upgrade"):
        Runtime.start(settings, None, migrate=True, schedule=False)
    upgrade_database(Database(settings.database_url))
    runtime = Runtime.start(settings, None, migrate=True, schedule=False)
    runtime.close()
