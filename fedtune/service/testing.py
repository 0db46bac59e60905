"""Helpers for tests and benchmarks that need a throw-away PostgreSQL schema or database
(Optuna's ``testing`` package is the model: storage fixtures shipped next to the storage)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

__all__ = ["temporary_pg_database", "temporary_pg_schema"]


@contextlib.contextmanager
def _temporary(url: str, create: str, drop: str, prefix: str) -> Iterator[str]:
    """Run ``create`` with a fresh name on the server at ``url``, yield the name, run ``drop``."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    with admin.connect() as conn:
        conn.execute(text(create.format(name=name)))
    try:
        yield name
    finally:
        with admin.connect() as conn:
            conn.execute(text(drop.format(name=name)))
        admin.dispose()


@contextlib.contextmanager
def temporary_pg_schema(url: str, prefix: str = "fedtune_tmp") -> Iterator[str]:
    """Create a fresh schema on the PostgreSQL at ``url``; yield a URL whose search_path is that
    schema; drop it (with everything in it) afterwards."""
    with _temporary(url, 'CREATE SCHEMA "{name}"', 'DROP SCHEMA "{name}" CASCADE', prefix) as name:
        yield f"{url}?options=-csearch_path%3D{name}"


@contextlib.contextmanager
def temporary_pg_database(url: str, prefix: str = "fedtune_tmp") -> Iterator[str]:
    """Create a fresh database on the PostgreSQL server at ``url``; yield its URL; drop it
    (its sessions ended) afterwards. A test whose outcome depends on what other sessions of the
    same database do needs one: ``VACUUM`` marks pages all-visible only past every transaction
    open in the database."""
    from sqlalchemy import make_url

    create, drop = 'CREATE DATABASE "{name}"', 'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
    with _temporary(url, create, drop, prefix) as name:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
