"""Fixtures of the service tests: databases (SQLite and PostgreSQL), settings, apps, specs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fedtune.service.db import Database
from fedtune.service.migrate import upgrade_database
from fedtune.service.services import ServiceContext
from fedtune.service.settings import Settings, load_settings

from ..needs import need
from .helpers import FakeBackend, pg_schema, pg_unreachable_reason

TOKEN = "t0ken-for-the-service-tests-0123456789"


@pytest.fixture(scope="session")
def pg_available() -> None:
    need("postgres", pg_unreachable_reason())


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database of each kind (PostgreSQL: its own schema, dropped after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fedtune.db'}"
        return
    request.getfixturevalue("pg_available")
    with pg_schema() as url:
        yield url


@pytest.fixture
def database(db_url: str) -> Iterator[Database]:
    db = Database(db_url)
    upgrade_database(db)
    yield db
    db.dispose()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Iterator[Database]:
    db = Database(f"sqlite:///{tmp_path / 'fedtune.db'}")
    upgrade_database(db)
    yield db
    db.dispose()


def settings_in(root: Path, **overrides) -> Settings:
    """The tests' settings with their files under ``root`` (a SQLite store there unless
    ``database_url`` says otherwise); for a module-scoped fixture, which has no ``tmp_path``."""
    base = {
        "database_url": f"sqlite:///{root / 'fedtune.db'}",
        "workdir": str(root / "work"),
        "backend": "none",
        "scheduler_interval_s": 0.05,
    }
    return load_settings(**(base | overrides))


@pytest.fixture
def make_settings(tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides) -> Settings:
        return settings_in(tmp_path, **overrides)

    return make


@pytest.fixture
def ctx(sqlite_db: Database, make_settings) -> ServiceContext:
    """A service context on a throw-away SQLite store with a fast heartbeat (driver tests)."""
    return ServiceContext(sqlite_db, make_settings(database_url=sqlite_db.url, heartbeat_s=0.05))


@pytest.fixture
def fake_backend() -> FakeBackend:
    return FakeBackend()
