"""A driver that fails says why, and a permanent failure is not retried (``local`` backend,
real child processes; the ``ray`` backend's side is in ``test_ray_failures.py``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fedtune.service.backends.base import DriverExit, last_error_line, python_driver_argv
from fedtune.service.backends.local import LocalBackend
from fedtune.service.faults import permanent_exit
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.states import StudyState

from .helpers import tiny_spec, until


def _run_one(ctx: ServiceContext, script: str) -> tuple[str, Scheduler, LocalBackend]:
    """Submit a study and dispatch it to a ``/bin/sh -c script`` driver; wait for its exit."""
    backend = LocalBackend(
        ctx.settings, argv=lambda sid, attempt: ["/bin/sh", "-c", script], grace_s=1.0
    )
    scheduler = Scheduler(ctx.db, backend, ctx.settings)
    sid = submit_study(ctx, tiny_spec(name="fails"))[0].id
    assert scheduler.tick().dispatched == [sid]
    with ctx.db.session(readonly=True) as s:
        ref = Repository(s).require_study(sid).driver_ref
    assert until(lambda: not backend.poll(ref).alive, 30)
    return sid, scheduler, backend


def _study(ctx: ServiceContext, sid: str):
    with ctx.db.session(readonly=True) as s:
        return Repository(s).require_study(sid)


@pytest.fixture
def local_ctx(database, make_settings) -> ServiceContext:
    """On SQLite and PostgreSQL (the failures were reported with PostgreSQL)."""
    return ServiceContext(
        database, make_settings(database_url=database.url, backend="local", max_dispatch_attempts=3)
    )


def test_a_driver_command_not_found_fails_the_study_at_once_and_says_so(local_ctx) -> None:
    sid, scheduler, backend = _run_one(local_ctx, "fedtune-not-installed worker run-study x")
    try:
        report = scheduler.tick()
        assert [r.action for r in report.recovered] == ["failed"]
        study = _study(local_ctx, sid)
        assert study.state == StudyState.FAILED
        assert study.attempts == 1
        assert "exit code 127" in study.error
        assert "fedtune-not-installed: not found" in study.error
        assert "not retried (command not found)" in study.error
    finally:
        backend.close()


def test_a_configuration_error_fails_the_study_at_once_with_its_line(local_ctx) -> None:
    line = "fedtune: error: FEDTUNE_DATABASE_URL: not set in the driver's environment"
    sid, scheduler, backend = _run_one(local_ctx, f'echo starting; echo "{line}" >&2; exit 2')
    try:
        scheduler.tick()
        study = _study(local_ctx, sid)
        assert (study.state, study.attempts) == (StudyState.FAILED, 1)
        assert line in study.error and "exit code 2" in study.error
    finally:
        backend.close()


def test_a_transient_failure_is_retried_and_says_why(local_ctx) -> None:
    script = "echo 'RuntimeError: the node went away' >&2; echo 'shutting down'; exit 1"
    sid, scheduler, backend = _run_one(local_ctx, script)
    try:
        report = scheduler.tick()
        assert [r.action for r in report.recovered] == ["requeued"]
        study = _study(local_ctx, sid)
        assert study.state in (StudyState.QUEUED, StudyState.RUNNING)  # re-dispatched already
        assert "RuntimeError: the node went away" in study.error
        assert "attempt 2 of 3" in study.error
    finally:
        backend.close()


def test_a_driver_log_line_with_a_credentialed_uri_is_stored_without_it(local_ctx) -> None:
    line = "MlflowException: API request to http://u:S3cretPW@127.0.0.1:9/api failed"
    sid, scheduler, backend = _run_one(local_ctx, f"echo '{line}' >&2; exit 1")
    try:
        scheduler.tick()
        study = _study(local_ctx, sid)
        assert "API request to http://***@127.0.0.1:9/api failed" in study.error
        assert "S3cretPW" not in study.error
    finally:
        backend.close()


def test_exit_statuses_are_classified_in_one_place() -> None:
    assert permanent_exit(127) == "command not found"
    assert permanent_exit(2) == "a configuration error"
    assert permanent_exit(126)
    for code in (None, 1, 69, 137, -9, 143):
        assert permanent_exit(code) is None
    assert DriverExit() == DriverExit(None, None)


def test_the_last_error_line_of_a_log() -> None:
    log = "INFO start\nTraceback (most recent call last):\n  File 'x'\nValueError: bad\n\ndone\n"
    assert last_error_line(log) == "ValueError: bad"
    assert last_error_line("a\nb\n") == "b"
    assert last_error_line("\x1b[31m/bin/sh: 1: fedtune: not found\x1b[0m\n") == (
        "/bin/sh: 1: fedtune: not found"
    )
    assert last_error_line("") is None


def test_a_driver_without_a_database_url_stops_with_one_line(tmp_path: Path) -> None:
    """No ``FEDTUNE_DATABASE_URL``: no SQLite file in the working directory, exit 2, one line
    that names the variable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEDTUNE_")}
    env["FEDTUNE_WORKDIR"] = str(tmp_path / "work")
    proc = subprocess.run(
        python_driver_argv("0123456789ab", 1),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fedtune: error: FEDTUNE_DATABASE_URL: not set")
    assert not list(tmp_path.rglob("*.db")), "the driver created a SQLite file"


def test_the_embedded_default_database_reaches_the_local_driver(
    make_settings, tmp_path: Path, monkeypatch
) -> None:
    """The default ``sqlite:///./fedtune.db`` is the service's file: the driver, which runs in
    the workdir, gets its absolute path (not a new, empty ``<workdir>/fedtune.db``)."""
    monkeypatch.chdir(tmp_path)
    settings = make_settings(backend="local", database_url="sqlite:///./fedtune.db")
    env = LocalBackend(settings)._env()
    assert env["FEDTUNE_DATABASE_URL"] == f"sqlite:///{tmp_path / 'fedtune.db'}"
    remote = "postgresql+psycopg://fedtune:s3cr3t-pw@db:5432/fedtune"
    env = LocalBackend(make_settings(backend="local", database_url=remote))._env()
    assert env["FEDTUNE_DATABASE_URL"] == remote
