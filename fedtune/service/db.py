"""Engine, sessions and the one commit/rollback boundary (Optuna's ``_create_scoped_session``).

Every database access of the service, the scheduler and the study driver goes through
:meth:`Database.session`: it commits on success, rolls back on any exception and turns
SQLAlchemy errors into service errors — unreachable/locked database → ``DatabaseUnavailableError``
(503), constraint violation → ``ConflictError`` (409), anything else → ``DatabaseError`` (500).
Messages never include the URL (it may hold a password).

SQLite (the default) runs in WAL mode with a busy timeout; write sessions start with
``BEGIN IMMEDIATE`` so that two processes (the service and a study driver) writing the same file
wait for each other instead of failing with a stale read snapshot; read sessions use a deferred
``BEGIN`` and never block writers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    DBAPIError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import StaticPool

from fedtune.errors import ConflictError, FedtuneError

from .errors import DatabaseError, DatabaseUnavailableError

__all__ = ["Database", "make_engine", "translate_db_error"]

log = logging.getLogger(__name__)
SQLITE_BUSY_TIMEOUT_S = 30.0


def make_engine(url: str) -> Engine:
    """An engine for ``url`` with the pragmas/pool settings fedtune relies on."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
    memory = parsed.database in (None, "", ":memory:")
    engine = create_engine(
        url,
        connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S},
        poolclass=StaticPool if memory else None,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # SQLAlchemy's "begin" event below issues BEGIN
        cursor = dbapi_conn.cursor()
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        readonly = conn.get_execution_options().get("fedtune_readonly", False)
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

    return engine


def translate_db_error(exc: SQLAlchemyError) -> FedtuneError:
    """The service error for a database error (the message omits URLs and SQL parameters)."""
    if isinstance(exc, IntegrityError):
        return ConflictError("the write conflicts with existing data (unique or foreign key)")
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeout) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return DatabaseUnavailableError("the database is unavailable; retry later")
    return DatabaseError(f"database error ({type(exc).__name__})")


class Database:
    """Sessions on one engine. ``session()`` writes, ``session(readonly=True)`` only reads."""

    def __init__(self, url: str, engine: Engine | None = None) -> None:
        self.url = url
        self.engine = engine or make_engine(url)
        self._write = sessionmaker(self.engine, expire_on_commit=False)
        reader = self.engine.execution_options(fedtune_readonly=True)
        self._read = sessionmaker(reader, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self, *, readonly: bool = False) -> Iterator[Session]:
        """The commit/rollback boundary: commit on success, roll back and translate on error."""
        session = (self._read if readonly else self._write)()
        try:
            yield session
            if not readonly:  # a read-only session ends with close(): objects stay loaded
                session.commit()
        except SQLAlchemyError as exc:
            session.rollback()
            log.warning("database error: %s", type(exc).__name__)
            raise translate_db_error(exc) from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def ping(self) -> None:
        """Raise ``DatabaseUnavailableError`` unless a trivial query answers."""
        with self.session(readonly=True) as session:
            session.execute(text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()
