"""An MLflow tracking store's tables, created once however many drivers open it at once.

MLflow creates its tables (and runs its migrations) when a process first opens a database
store that lacks them, with no lock between processes: two drivers opening a just-created
PostgreSQL database at the same moment both run ``CREATE TABLE`` and one fails with
``UniqueViolation … "pg_type_typname_nsp_index"``. :func:`prepare_tracking_store` opens the
store first under a PostgreSQL advisory lock (drivers may be processes on other machines, so
a file lock would not do): the first holder creates the tables, the others then find them.
For other databases (MySQL, SQL Server) a failed creation is retried, since the tables the
other driver made are there when it is tried again. SQLite stores are seeded from a template
(:mod:`fedtune.tuning.mlflow.sqlite_template`), file and HTTP stores create nothing: left alone.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import Any

__all__ = ["STORE_LOCK_KEY", "prepare_tracking_store"]

log = logging.getLogger(__name__)

#: the advisory lock (a signed 64-bit key) held while a store's tables are created
STORE_LOCK_KEY = int.from_bytes(
    hashlib.sha256(b"fedtune:mlflow-tracking-store").digest()[:8], "big", signed=True
)
LOCK_WAIT_S = 300.0
ATTEMPTS = 5


def _dialect(uri: str) -> str | None:
    """The database of a SQLAlchemy URI (``postgresql``, ``mysql``, …); None for other URIs."""
    scheme = uri.split("://", 1)[0] if "://" in uri else ""
    dialect = scheme.split("+", 1)[0].lower()
    return dialect if dialect in ("postgresql", "mysql", "mssql") else None


def _open_store(uri: str) -> None:
    """Open MLflow's store of ``uri`` (creating its tables if missing) with one cheap query."""
    from mlflow import MlflowClient

    MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def prepare_tracking_store(uri: str, *, wait_s: float = LOCK_WAIT_S) -> None:
    """Make sure the tables of the MLflow store at ``uri`` exist before a study uses it.

    Args:
        uri: The tracking URI; only database URIs (PostgreSQL, MySQL, SQL Server) need this.
        wait_s: How long to wait for another process that is creating the tables.

    Returns:
        None; raises what MLflow raises when the store cannot be opened (a wrong password, an
        unreachable server), or TimeoutError when the lock stays held for ``wait_s``.
    """
    dialect = _dialect(uri)
    if dialect is None:
        return
    if dialect == "postgresql":
        with _advisory_lock(uri, wait_s):
            _open_store(uri)
        return
    for attempt in range(1, ATTEMPTS + 1):
        try:
            _open_store(uri)
            return
        except Exception as exc:  # a creation that raced another driver's: try again
            if attempt == ATTEMPTS:
                raise
            log.info("MLflow store not ready (%s), retrying", type(exc).__name__)
            time.sleep(0.5 * attempt)


class _advisory_lock:
    """PostgreSQL's session-level advisory lock :data:`STORE_LOCK_KEY` on its own connection
    (released on exit, or by the server if this process dies)."""

    def __init__(self, uri: str, wait_s: float) -> None:
        self.uri, self.wait_s = uri, wait_s
        self.engine: Any = None
        self.conn: Any = None

    def __enter__(self) -> None:
        from sqlalchemy import create_engine, text
        from sqlalchemy.pool import NullPool

        self.engine = create_engine(self.uri, poolclass=NullPool)
        self.conn = self.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        deadline = time.monotonic() + self.wait_s
        query = text("SELECT pg_try_advisory_lock(:key)")
        while not self.conn.execute(query, {"key": STORE_LOCK_KEY}).scalar():
            if time.monotonic() > deadline:
                self._close()
                raise TimeoutError(
                    f"another process held the MLflow store lock for {self.wait_s:g} s"
                )
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        from sqlalchemy import text

        try:
            self.conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": STORE_LOCK_KEY})
        finally:
            self._close()

    def _close(self) -> None:
        self.conn.close()
        self.engine.dispose()
