"""With months of history every query of the study list, of one study and of
the scheduler's tick reads an index, never the whole ``studies`` or ``trials`` table.

A PostgreSQL schema is seeded (``benchmarks/seed_history.py``: a few thousand studies, mostly
finished, tens of thousands of trials) and analysed; the service functions and one scheduler
tick then run for real while every SQL statement they send is captured, and each is planned
with ``EXPLAIN (FORMAT JSON)``: no ``Seq Scan`` on ``studies`` or ``trials`` may appear. Before
revision 0005 the unfiltered list sorted the table (no ``(created_at, id)`` index), the
project filter wrapped the column in ``coalesce()`` (no index serves it), and the tick counted
every study by state and scanned all studies for the fair-share window.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

from fedtune.service.access import Principal
from fedtune.service.db import Database
from fedtune.service.paging import Order
from fedtune.service.project_usage import project_usage
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, get_study, list_studies
from fedtune.service.states import StudyState
from tests.benchmarks import load_benchmark

from .helpers import FakeBackend, pg_database

WATCHED = {"studies", "trials"}


class KeepingBackend(FakeBackend):
    """Every driver alive; finished drivers are kept until released (as RayJobs are), so the
    tick's release query runs too."""

    keeps_finished = True

    def poll(self, ref):
        from fedtune.service.backends.base import DriverStatus

        return DriverStatus.RUNNING

    def release(self, ref) -> bool:
        return True


@pytest.fixture(scope="module")
def history(pg_available) -> Iterator[tuple[Database, Any]]:
    seeder = load_benchmark("seed_history.py")
    # a database of its own: VACUUM marks the seeded pages all-visible (what lets a count
    # read the index alone) only past the transactions open in the same database, and the
    # tests on another worker keep some open in the shared one
    with pg_database("fedtune_plans") as url:
        seeded = seeder.seed(url, 3000, 30_000, now=dt.datetime.now(dt.UTC))
        db = Database(url)
        yield db, seeded
        db.dispose()


@contextlib.contextmanager
def captured(db: Database) -> Iterator[list[tuple[str, Any]]]:
    """Every statement sent to the database inside the block, with its parameters."""
    sent: list[tuple[str, Any]] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE", "WITH")):
            sent.append((statement, parameters))

    event.listen(db.engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(db.engine, "before_cursor_execute", record)


def _nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def scans(db: Database, statements: list[tuple[str, Any]]) -> list[tuple[str, str, str]]:
    """``(node type, relation, statement)`` of every scan of a watched table in the plans."""
    found = []
    with db.engine.connect() as conn:
        for statement, parameters in statements:
            plan = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar()
            for node in _nodes(plan[0]["Plan"]):
                if node.get("Relation Name") in WATCHED:
                    found.append((node["Node Type"], node["Relation Name"], statement))
        conn.rollback()
    return found


def assert_indexed(db: Database, statements: list[tuple[str, Any]]) -> None:
    assert statements, "nothing was captured"
    found = scans(db, statements)
    assert found, "no scan of studies/trials in the plans"
    seq = [
        (kind, table, sql.split("\n")[0][:200]) for kind, table, sql in found if kind == "Seq Scan"
    ]
    assert not seq, f"sequential scans: {seq}"


def _ctx(db: Database, make_settings) -> ServiceContext:
    return ServiceContext(db, make_settings(database_url=db.url))


LISTS = {
    "first page": {},
    "one state": {"state": StudyState.SUCCEEDED},
    "live states": {"state": [StudyState.QUEUED, StudyState.RUNNING]},
    "project": {"project": "vision"},
    "project and state": {"project": "speech", "state": StudyState.FAILED},
    "project and states": {"project": "nlp", "state": [StudyState.FAILED, StudyState.CANCELLED]},
    "ascending": {"order": Order.ASC},
    "ascending, one state": {"order": Order.ASC, "state": StudyState.CANCELLED},
}


@pytest.mark.parametrize("name", list(LISTS))
def test_every_list_query_reads_an_index(history, make_settings, name) -> None:
    db, _ = history
    ctx = _ctx(db, make_settings)
    kwargs = LISTS[name]
    with captured(db) as first:
        page = list_studies(ctx, limit=50, include_total=True, **kwargs)
    assert page.items and page.total is not None
    assert_indexed(db, first)
    deep = page
    for _ in range(5):  # a few pages further: the keyset continues on the index
        if deep.next_page_token is None:
            break
        with captured(db) as later:
            deep = list_studies(ctx, limit=50, page_token=deep.next_page_token, **kwargs)
        assert_indexed(db, later)


def test_a_member_of_several_projects_lists_on_the_index(history, make_settings) -> None:
    db, _ = history
    member = Principal("ana", roles={"vision": "member", "nlp": "viewer"})
    with captured(db) as sent:
        page = list_studies(_ctx(db, make_settings), caller=member, limit=20)
        list_studies(
            _ctx(db, make_settings), caller=member, limit=20, page_token=page.next_page_token
        )
    assert {s.project for s in page.items} <= {"vision", "nlp"}
    assert_indexed(db, sent)


def test_get_study_reads_its_trials_by_index(history, make_settings) -> None:
    db, seeded = history
    ctx = _ctx(db, make_settings)
    with db.session() as s:  # a study still running: its best trial is computed, not stored
        sid = seeded.by_state["running"][0]
        s.execute(text("UPDATE studies SET best_trial = NULL WHERE id = :i"), {"i": sid})
    for study_id in (sid, seeded.by_state["succeeded"][-1]):
        with captured(db) as sent:
            detail = get_study(ctx, study_id)
        assert detail.progress.finished + detail.progress.running >= 9
        assert_indexed(db, sent)
    assert get_study(ctx, sid).best is not None


def test_the_scheduler_tick_reads_only_live_studies(history, make_settings) -> None:
    db, _ = history
    # no deadline: the seeded history's running studies started weeks ago, and failing them
    # would stop drivers this backend never launched (the deadline's query runs all the same)
    settings = make_settings(database_url=db.url, max_concurrent_studies=1000, study_deadline_s=0)
    scheduler = Scheduler(db, KeepingBackend(), settings)
    with captured(db) as sent:
        report = scheduler.tick()
    assert report.dispatched  # the whole tick ran: watch, release, admission, dispatch
    assert_indexed(db, sent)
    with captured(db) as sent, db.session(readonly=True) as session:
        usage = project_usage(session, "vision", settings)
    assert usage["studies"]["running"] >= 0
    assert_indexed(db, sent)
