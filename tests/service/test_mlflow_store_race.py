"""Drivers that open one new MLflow tracking store at the same moment all start.

Two studies of two projects, started together against ``MLFLOW_TRACKING_URI=postgresql://…`` (a
just-created database), used to run MLflow's "Creating initial MLflow database tables…" at
the same time: one failed with ``UniqueViolation … "pg_type_typname_nsp_index"``. Here four
processes (drivers are processes) open the store through :class:`StudyTracker`, as a driver
does, released together by a barrier once everything is imported.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pytest

from .helpers import pg_database

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # four processes import MLflow and Ray
DRIVERS = 4


def _open_store(uri: str, experiment: str, barrier, results) -> None:
    """One driver: import, wait for the others, open the store and the study's experiment."""
    try:
        from fedtune.tuning.mlflow.tracking import StudyTracker

        barrier.wait(timeout=180)
        tracker = StudyTracker(uri, experiment)
        results.put((experiment, "ok", tracker.experiment_id))
    except BaseException as exc:  # reported to the test, whatever it is
        results.put((experiment, f"{type(exc).__name__}: {exc}"[:800], None))


@pytest.fixture
def fresh_database(pg_available) -> Iterator[str]:
    """A just-created PostgreSQL database (MLflow's tables go to its ``public`` schema)."""
    with pg_database("fedtune_mlrace") as url:
        yield url


def test_drivers_opening_a_new_store_at_once_all_start(fresh_database: str) -> None:
    context = multiprocessing.get_context("spawn")  # drivers are separate processes
    barrier, results = context.Barrier(DRIVERS), context.Queue()
    procs = [
        context.Process(target=_open_store, args=(fresh_database, f"study-{i}", barrier, results))
        for i in range(DRIVERS)
    ]
    for proc in procs:
        proc.start()
    try:
        answers = [results.get(timeout=300) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join(10)
    failed = [f"{name}: {what}" for name, what, _ in answers if what != "ok"]
    assert not failed, "\n".join(failed)
    assert len({experiment_id for *_, experiment_id in answers}) == DRIVERS

    from mlflow import MlflowClient

    names = {e.name for e in MlflowClient(tracking_uri=fresh_database).search_experiments()}
    assert {f"study-{i}" for i in range(DRIVERS)} <= names
