"""``GET /v1/studies`` pages by keyset (``page_token`` → ``next_page_token``,
MLflow's convention) next to ``limit``/``offset``, filters by several states and a project,
sorts by creation time either way, counts ``total`` only on a first page (or on request), and
refuses a bad token or parameter with 422 naming the field. On SQLite and PostgreSQL.

Before, ``page_token`` was ignored (every "next page" was the first page again), ``state`` took
one value and the answer had no ``next_page_token``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from fedtune.service import identity
from fedtune.service.api import create_app
from fedtune.service.models import Study
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState

from .conftest import TOKEN, settings_in
from .helpers import FakeBackend, pg_schema

AUTH = {"Authorization": f"Bearer {TOKEN}"}
T0 = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
STATES = [StudyState.SUCCEEDED, StudyState.FAILED, StudyState.QUEUED, StudyState.RUNNING]
PROJECTS = ["default", "p1", "p2"]


@contextlib.contextmanager
def built_client(url: str, root: Path) -> Iterator[TestClient]:
    """37 studies over 3 projects and 4 states; created_at ties in threes (the id breaks them)."""
    app = create_app(
        settings_in(root, database_url=url, api_token=TOKEN),
        backend=FakeBackend(),
        schedule=False,
    )
    with TestClient(app, headers=AUTH) as tc:
        db = tc.app.state.runtime.db
        with db.session() as s:
            for p in PROJECTS[1:]:
                identity.create_project(s, p)
            repo = Repository(s)
            for i in range(37):
                state = STATES[i % 4]
                repo.add_study(
                    Study(
                        id=f"{(i * 7919) % 4096:03x}{i:09x}",
                        name=f"s{i}",
                        state=state,
                        spec={},
                        algorithm="fedavg",
                        task="quadratic",
                        trials_requested=1,
                        attempts=0,
                        project=PROJECTS[i % 3],
                        created_at=T0 + dt.timedelta(minutes=i // 3),
                    )
                )
            identity.create_user(s, "mia")
            identity.add_member(s, "mia", "p1", "viewer")
            identity.add_member(s, "mia", "p2", "member")
            tc.mia = {"Authorization": f"Bearer {identity.issue_token(s, 'mia').secret}"}
        yield tc


@pytest.fixture
def client(db_url, tmp_path) -> Iterator[TestClient]:
    """The studies in a database of the test's own: for a test that adds one."""
    with built_client(db_url, tmp_path) as tc:
        yield tc


def _studies(tc: TestClient) -> list:
    with tc.app.state.runtime.db.session(readonly=True) as s:
        return sorted(map(repr, s.execute(text("SELECT * FROM studies")).all()))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def reader(request, tmp_path_factory) -> Iterator[TestClient]:
    """The studies built once per database for the tests that only read them (not once per
    parametrized case); afterwards they are what they were."""
    root = tmp_path_factory.mktemp("paging")
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{root / 'fedtune.db'}"
        else:
            request.getfixturevalue("pg_available")
            url = stack.enter_context(pg_schema())
        tc = stack.enter_context(built_client(url, root))
        before = _studies(tc)
        yield tc
        assert _studies(tc) == before, "a test that only reads changed the studies"


def _key(item: dict) -> tuple:
    return dt.datetime.fromisoformat(item["created_at"]), item["id"]


def walk(c: TestClient, headers: dict | None = None, **params) -> tuple[list[dict], list[dict]]:
    """Every item of the list by following ``next_page_token``; and the pages' answers."""
    items, pages, token = [], [], None
    for _ in range(100):
        query = {**params, **({"page_token": token} if token else {})}
        r = c.get("/v1/studies", params=query, headers=headers)
        assert r.status_code == 200, r.text
        page = r.json()
        pages.append(page)
        items += page["items"]
        token = page["next_page_token"]
        if token is None:
            return items, pages
    raise AssertionError("more than 100 pages")


@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize(
    "filters",
    [
        {},
        {"state": "queued"},
        {"state": ["succeeded", "failed"]},
        {"project": "p1"},
        {"project": "p2", "state": ["queued", "running"]},
    ],
    ids=["all", "one-state", "two-states", "project", "project-states"],
)
def test_the_token_walks_every_study_once_in_order(reader, order, filters) -> None:
    everything = reader.get("/v1/studies", params={"limit": 500, "order": order, **filters}).json()
    expected = everything["items"]
    assert expected and everything["next_page_token"] is None
    states = filters.get("state")
    states = {states} if isinstance(states, str) else set(states or [s.value for s in STATES])
    assert all(s["state"] in states for s in expected)
    assert all(s["project"] == filters.get("project", s["project"]) for s in expected)
    keys = [_key(s) for s in expected]
    assert keys == sorted(keys, reverse=order == "desc")

    items, pages = walk(reader, limit=4, order=order, **filters)
    assert [s["id"] for s in items] == [s["id"] for s in expected]  # none twice, none lost
    assert len(pages) == -(-len(expected) // 4)
    assert pages[0]["total"] == len(expected)  # counted on the first page ...
    assert all(p["total"] is None for p in pages[1:])  # ... not on pages reached by token


def test_a_study_created_while_paging_neither_repeats_nor_shifts_pages(client) -> None:
    first = client.get("/v1/studies", params={"limit": 5}).json()
    with client.app.state.runtime.db.session() as s:  # newest of all: before page 1
        Repository(s).add_study(
            Study(
                id="fffffffffff0",
                name="new",
                state=StudyState.QUEUED,
                spec={},
                algorithm="fedavg",
                task="quadratic",
                trials_requested=1,
                attempts=0,
                project="default",
            )
        )
    second = client.get(
        "/v1/studies", params={"limit": 5, "page_token": first["next_page_token"]}
    ).json()
    by_offset = client.get("/v1/studies", params={"limit": 5, "offset": 5}).json()
    ids = [s["id"] for s in first["items"] + second["items"]]
    assert len(set(ids)) == 10 and "fffffffffff0" not in ids
    assert by_offset["items"][0]["id"] == first["items"][-1]["id"]  # offset shifted by one


def test_offset_paging_is_unchanged_and_hands_out_a_token(reader) -> None:
    page = reader.get("/v1/studies", params={"limit": 10, "offset": 10}).json()
    assert page["total"] == 37 and page["offset"] == 10 and len(page["items"]) == 10
    after = reader.get(
        "/v1/studies", params={"limit": 10, "page_token": page["next_page_token"]}
    ).json()
    again = reader.get("/v1/studies", params={"limit": 10, "offset": 20}).json()
    assert [s["id"] for s in after["items"]] == [s["id"] for s in again["items"]]


def test_total_only_when_asked_on_token_pages(reader) -> None:
    first = reader.get("/v1/studies", params={"limit": 3, "include_total": "false"}).json()
    assert first["total"] is None
    token = first["next_page_token"]
    counted = reader.get(
        "/v1/studies", params={"limit": 3, "page_token": token, "include_total": "true"}
    ).json()
    assert counted["total"] == 37


def test_a_member_pages_through_its_projects_only(reader) -> None:
    items, _ = walk(reader, reader.mia, limit=5)
    assert {s["project"] for s in items} == {"p1", "p2"}
    assert len(items) == sum(1 for i in range(37) if PROJECTS[i % 3] != "default")
    assert walk(reader, reader.mia, project="default")[0] == []  # not a project of mia's


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"page_token": "not-a-token"}, "query.page_token"),
        ({"page_token": "eyJ2IjoxfQ"}, "query.page_token"),  # base64 JSON, but not ours
        ({"page_token": "TOKEN", "state": "queued"}, "query.page_token"),  # other filters
        ({"page_token": "TOKEN", "order": "asc"}, "query.page_token"),  # other order
        ({"page_token": "TOKEN", "offset": 3}, "query.offset"),
        ({"state": ["queued", "sleeping"]}, "query.state.1"),
        ({"order": "up"}, "query.order"),
        ({"include_total": "maybe"}, "query.include_total"),
        ({"page_token": "x" * 513}, "query.page_token"),
    ],
)
def test_invalid_tokens_and_parameters_are_422_naming_the_field(reader, params, field) -> None:
    token = reader.get("/v1/studies", params={"limit": 2}).json()["next_page_token"]
    if params.get("page_token") == "TOKEN":
        params = {**params, "page_token": token}
    r = reader.get("/v1/studies", params=params)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == field


def test_ties_in_creation_time_are_broken_by_id(reader) -> None:
    items, _ = walk(reader, limit=2, order="asc")
    for a, b in itertools.pairwise(items):
        assert _key(a) < _key(b)
