"""Run the Alembic migrations shipped in the package, or refuse to start on an old schema.

``fedtune db upgrade`` (the Helm chart's pre-install/pre-upgrade hook Job) calls
:func:`upgrade_database`; ``fedtune serve`` does too unless ``FEDTUNE_MIGRATE_ON_START=false``
(the chart's setting), in which case it calls :func:`require_current_schema` and stops with one
line naming both revisions. On PostgreSQL an advisory lock in ``migrations/env.py`` serialises
concurrent upgrades.

Production paths never call ``create_all``: the schema is whatever the revisions in
``migrations/versions`` build (docs/development/style.md habit 12, "migrations are product").
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from fedtune.errors import FedtuneError

from .db import Database

__all__ = [
    "ALEMBIC_INI",
    "MIGRATIONS_DIR",
    "SchemaOutdatedError",
    "current_revision",
    "head_revision",
    "require_current_schema",
    "upgrade_database",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
ALEMBIC_INI = MIGRATIONS_DIR / "alembic.ini"


def alembic_config() -> Config:
    cfg = Config(str(ALEMBIC_INI))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade_database(db: Database, revision: str = "head") -> str | None:
    """Upgrade ``db`` to ``revision`` (idempotent) and return the revision it is now at."""
    cfg = alembic_config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
    return current_revision(db.engine)


class SchemaOutdatedError(FedtuneError):
    """The database is not at the revision this fedtune needs (the message says what to run)."""

    code = "schema_outdated"


def require_current_schema(db: Database) -> str:
    """Return the head revision if ``db`` is at it; else raise :class:`SchemaOutdatedError`."""
    head = head_revision()
    current = current_revision(db.engine)
    if current != head:
        raise SchemaOutdatedError(
            f"database schema is at revision {current or 'none (empty database)'}, this fedtune "
            f"needs {head}: run `fedtune db upgrade` first (the Helm chart's hook Job does)"
        )
    return head
