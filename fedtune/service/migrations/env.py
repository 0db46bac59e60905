"""Alembic environment of the fedtune service database.

Uses the connection passed in ``config.attributes["connection"]`` (what
``fedtune.service.migrate.upgrade_database`` does) or else ``sqlalchemy.url`` /
``FEDTUNE_DATABASE_URL``. On PostgreSQL an advisory lock serialises concurrent upgrades (several
API replicas starting at once).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from fedtune.service.db import make_engine
from fedtune.service.models import Base
from fedtune.service.settings import database_url_from_env

config = context.config
target_metadata = Base.metadata
#: arbitrary constant naming fedtune's migration lock (pg_advisory_xact_lock key)
PG_LOCK_KEY = 0x0FED7E


def _url() -> str:
    return (
        config.get_main_option("sqlalchemy.url")
        or database_url_from_env()
        or "sqlite:///./fedtune.db"
    )


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PG_LOCK_KEY})
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
