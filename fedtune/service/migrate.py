"""Run the Alembic migrations shipped in the package (``fedtune serve`` does so at start).

Production paths never call ``create_all``: the schema is whatever the revisions in
``migrations/versions`` build (STYLE.md habit 12, "migrations are product").
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from .db import Database

__all__ = ["ALEMBIC_INI", "MIGRATIONS_DIR", "current_revision", "head_revision", "upgrade_database"]

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
