"""Helpers for tests and benchmarks that need a throw-away PostgreSQL schema (Optuna's
``testing`` package is the model: storage fixtures shipped next to the storage)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

__all__ = ["temporary_pg_schema"]


@contextlib.contextmanager
def temporary_pg_schema(url: str, prefix: str = "fedtune_tmp") -> Iterator[str]:
    """Create a fresh schema on the PostgreSQL at ``url``; yield a URL whose search_path is that
    schema; drop it (with everything in it) afterwards."""
    from sqlalchemy import create_engine, text

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})
    with admin.connect() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
    try:
        yield f"{url}?options=-csearch_path%3D{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP SCHEMA "{name}" CASCADE'))
        admin.dispose()
