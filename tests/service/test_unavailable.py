"""Every 503 says when to come back, and readiness tells a full disk from a database outage."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fedtune.errors import DatabaseUnavailableError, WorkdirUnwritableError
from fedtune.service.api import create_app
from fedtune.wire import exception_from_body

from .helpers import FakeBackend, tiny_spec


@pytest.fixture
def client(make_settings: Callable) -> Iterator[TestClient]:
    app = create_app(make_settings(), backend=FakeBackend(), schedule=False)
    with TestClient(app) as c:
        assert c.app.state.runtime.ctx.warmup.done.wait(300)
        yield c


def test_a_database_outage_answers_503_with_retry_after(client: TestClient, monkeypatch) -> None:
    def down(*args, **kwargs):
        raise DatabaseUnavailableError("the database is unavailable; retry later")

    runtime = client.app.state.runtime
    monkeypatch.setattr(runtime.db, "ping", down)
    monkeypatch.setattr(runtime.db, "session", down)
    for method, path, body in (
        ("GET", "/readyz", None),
        ("GET", "/v1/studies", None),
        ("POST", "/v1/studies", tiny_spec()),
    ):
        r = client.request(method, path, json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "database_unavailable"
        assert int(r.headers["Retry-After"]) >= 1, (method, path)


def test_readiness_turns_unready_when_the_workdir_cannot_be_written(
    client: TestClient, monkeypatch, tmp_path: Path
) -> None:
    assert client.get("/readyz").status_code == 200
    real_fsync = os.fsync

    def full(fd: int) -> None:  # what a full disk answers when the probe reaches it
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    r = client.get("/readyz")
    assert r.status_code == 503 and r.headers["Retry-After"] == "5"
    error = r.json()["error"]
    assert error["code"] == "workdir_unwritable" and "No space left on device" in error["message"]
    assert str(tmp_path) not in r.text  # the open endpoint names no server path
    assert isinstance(exception_from_body(r.status_code, r.json()), WorkdirUnwritableError)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert client.get("/readyz").status_code == 200


def test_a_workdir_that_is_not_a_directory_is_unready(make_settings, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    app = create_app(
        make_settings(workdir=str(blocker / "work")), backend=FakeBackend(), schedule=False
    )
    with TestClient(app) as c:
        assert c.app.state.runtime.ctx.warmup.done.wait(300)
        r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["error"]["code"] == "workdir_unwritable"
