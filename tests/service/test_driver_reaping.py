"""Finished drivers are reaped: a driver ends its own study, the scheduler then
never polls that study again, and each finished study used to leave one ``<defunct>`` child of
the service (22 after 24 studies)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from fedtune.service.backends.local import LocalBackend
from fedtune.service.db import Database
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.states import StudyState

from .helpers import tiny_spec, until


def _state(pid: int) -> str | None:
    """The process state letter from /proc (None: no such process, i.e. reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or the read
        return None


def test_the_scheduler_reaps_the_drivers_of_finished_studies(
    sqlite_db: Database, make_settings: Callable
) -> None:
    settings = make_settings(database_url=sqlite_db.url, backend="local", max_concurrent_studies=3)
    # a stand-in driver that exits at once (the real one ends its study, then exits)
    backend = LocalBackend(
        settings, argv=lambda sid, attempt: [sys.executable, "-c", "pass"], grace_s=1.0
    )
    scheduler = Scheduler(sqlite_db, backend, settings)
    ctx = ServiceContext(sqlite_db, settings, scheduler)
    try:
        ids = [submit_study(ctx, tiny_spec(name=f"s{i}"))[0].id for i in range(3)]
        assert scheduler.tick().dispatched == ids
        with sqlite_db.session(readonly=True) as s:
            pids = [Repository(s).require_study(i).driver_ref["pid"] for i in ids]
        with sqlite_db.session() as s:  # each driver ended its study, as the real one does
            for study_id in ids:
                Repository(s).transition(study_id, StudyState.SUCCEEDED)
        assert until(lambda: all(_state(p) in ("Z", None) for p in pids), 20, every=0.05), (
            "drivers did not exit"
        )
        scheduler.tick()
        assert [_state(p) for p in pids] == [None, None, None]  # no <defunct> child is left
    finally:
        backend.close()
