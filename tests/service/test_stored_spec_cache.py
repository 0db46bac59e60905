"""A study's stored spec is parsed once per study, not once per read.

The scheduler's tick reads the fair-share window's rows again on every tick; each read used to
validate the row's document into a ``StoredSpec`` again (16.6 µs a row). Here: the parts are
kept by the row's identity ``(id, created_at)``, across sessions and row objects; a study with
the same id in another database (tests reuse fixed ids) is parsed on its own; the kept specs are
bounded.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from fedtune.service import specs
from fedtune.service.db import Database
from fedtune.service.migrate import upgrade_database
from fedtune.service.models import Study
from fedtune.service.project_usage import recent_studies
from fedtune.service.specs import accept_spec, stored_spec_of
from fedtune.service.states import StudyState

from .helpers import tiny_spec


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Each document :func:`specs.stored_spec` validates, in order; the kept specs emptied."""
    seen: list[Any] = []
    parse = specs.stored_spec

    def counting(document: Any) -> Any:
        seen.append(document)
        return parse(document)

    monkeypatch.setattr(specs, "stored_spec", counting)
    monkeypatch.setattr(specs, "_stored", type(specs._stored)())
    return seen


def _add(db: Database, study_id: str, trials: int) -> dict[str, Any]:
    document = accept_spec(tiny_spec(name=study_id, trials=trials)).document
    now = dt.datetime.now(dt.UTC)
    with db.session() as s:
        s.add(
            Study(
                id=study_id,
                name=study_id,
                state=StudyState.RUNNING,
                spec=document,
                algorithm="fedavg",
                task="quadratic",
                trials_requested=trials,
                started_at=now,
            )
        )
    return document


def test_a_key_is_parsed_once_and_the_kept_specs_are_bounded(
    parses: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = {"budget": {"trials": 3}}, {"budget": {"trials": 5}}
    first = stored_spec_of(("a", 1), one)
    assert stored_spec_of(("a", 1), one) is first
    assert first.budget.trials == 3
    assert stored_spec_of(("a", 2), two).budget.trials == 5  # same id, another row
    assert parses == [one, two]
    monkeypatch.setattr(specs, "STORED_SPECS_KEPT", 2)
    stored_spec_of(("b", 1), two)  # ("a", 1) is the least recently read: dropped
    stored_spec_of(("a", 2), two)
    assert len(specs._stored) == 2 and len(parses) == 3
    assert stored_spec_of(("a", 1), one) is not first  # parsed again
    assert len(parses) == 4


def test_the_fair_share_window_parses_each_study_once_across_ticks(
    parses: list[Any], sqlite_db: Database, tmp_path, make_settings
) -> None:
    document = _add(sqlite_db, "s1", trials=3)
    settings = make_settings(database_url=sqlite_db.url)
    for _ in range(3):  # three ticks: three sessions, new row tuples each time
        with sqlite_db.session(readonly=True) as s:
            rows = recent_studies(s, dt.datetime.now(dt.UTC), settings)
            assert [r[2].budget.trials for r in rows] == [3]
        with sqlite_db.session(readonly=True) as s:  # the row object's own property
            assert s.get(Study, "s1").sections.budget.trials == 3
    assert parses == [document]

    # the same id in another database is another study: parsed on its own
    other = Database(f"sqlite:///{tmp_path / 'other.db'}")
    upgrade_database(other)
    try:
        _add(other, "s1", trials=7)
        with other.session(readonly=True) as s:
            assert s.get(Study, "s1").sections.budget.trials == 7
    finally:
        other.dispose()
    assert len(parses) == 2


def test_a_row_not_yet_flushed_is_parsed_and_not_kept(parses: list[Any]) -> None:
    row = Study(spec={"budget": {"trials": 4}})
    assert row.sections.budget.trials == 4
    assert len(specs._stored) == 0 and len(parses) == 1
