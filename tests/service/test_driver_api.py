"""A driver that reports through the service's API with its study's own credential.

The same stand-in ``run_study`` as ``test_driver.py``, with the driver's link an
:class:`~fedtune.service.driver_link.ApiLink` to a real app on the same database: what it records
is what the database link records, and the credential opens that study's attempt only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from fedtune.service.api import create_app
from fedtune.service.child_env import ChildKind, child_env
from fedtune.service.code_url import code_url_key
from fedtune.service.driver import run_driver
from fedtune.service.driver_link import ApiLink, driver_token
from fedtune.service.models import Study
from fedtune.service.repository import Repository
from fedtune.service.services import ServiceContext
from fedtune.service.states import StudyState

from .conftest import TOKEN
from .helpers import running_study
from .test_driver import assert_fake_study_recorded, fake_run_study

BASE = "http://testserver"


@pytest.fixture
def api(ctx: ServiceContext, make_settings) -> Iterator[tuple[TestClient, ServiceContext]]:
    """The service's app on the driver tests' database, with a bootstrap token."""
    settings = make_settings(database_url=ctx.db.url, heartbeat_s=0.05, api_token=TOKEN)
    with TestClient(create_app(settings, backend=None, schedule=False)) as client:
        yield client, ServiceContext(ctx.db, settings)


def _link(client: TestClient, settings, sid: str, attempt: int = 1) -> ApiLink:
    token = driver_token(code_url_key(settings), sid, attempt)
    return ApiLink(BASE, sid, token, client=client)


def test_a_driver_records_its_study_through_the_api(api) -> None:
    client, ctx = api
    sid = running_study(ctx)
    link = _link(client, ctx.settings, sid)
    with ctx.db.session() as s:  # the study's owner reaches the driver with its claim
        s.get(Study, sid).owner = "alice"
    assert run_driver(sid, ctx.settings, 1, run_study=fake_run_study, link=link) == 0
    assert_fake_study_recorded(ctx, sid)
    assert fake_run_study.seen["run_user"] == "alice"


def test_a_driver_token_opens_its_own_study_and_attempt_only(api) -> None:
    client, ctx = api
    mine, other = running_study(ctx), running_study(ctx, name="other")
    token = driver_token(code_url_key(ctx.settings), mine, 1)
    bearer = {"Authorization": f"Bearer {token}"}
    assert client.get(f"/v1/driver/studies/{mine}", headers=bearer).json()["attempts"] == 1
    # another study, a forged token, the admin's API token, none: all the same 404
    for sid, headers in [
        (other, bearer),
        (mine, {"Authorization": "Bearer ftd.1." + "0" * 64}),
        (mine, {"Authorization": f"Bearer {TOKEN}"}),
        (mine, {}),
    ]:
        answer = client.post(f"/v1/driver/studies/{sid}/heartbeat", headers=headers)
        assert answer.status_code == 404, (sid, headers, answer.text)
    # a driver token is no API token either
    assert client.get("/v1/studies", headers=bearer).status_code == 401
    # a re-dispatched study: the old attempt's writes are refused, its heartbeat says stop
    with ctx.db.session() as s:
        Repository(s).update_study(mine, attempts=2)
    end = {"state": "failed", "values": {"error": "late"}}
    assert (
        client.post(f"/v1/driver/studies/{mine}/finish", json=end, headers=bearer).status_code
        == 409
    )
    assert client.post(f"/v1/driver/studies/{mine}/heartbeat", headers=bearer).json() is False
    assert "/v1/driver/studies/{study_id}" not in client.get("/openapi.json").json()["paths"]


def test_a_driver_cannot_write_more_than_its_final_state(api) -> None:
    client, ctx = api
    sid = running_study(ctx)
    bearer = {"Authorization": f"Bearer {driver_token(code_url_key(ctx.settings), sid, 1)}"}
    for body in (
        {"state": "queued", "values": {}},  # only succeeded or failed
        {"state": "failed", "values": {"project": "other"}},  # only the final fields
        {"state": "failed", "values": {"owner": "admin"}},
    ):
        answer = client.post(f"/v1/driver/studies/{sid}/finish", json=body, headers=bearer)
        assert answer.status_code == 422, answer.text
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
    assert study.state == StudyState.RUNNING and study.project == "default"


def test_a_local_driver_gets_its_study_credential_and_no_database_url(make_settings) -> None:
    settings = make_settings(backend="local", driver_url="http://127.0.0.1:8123", api_token=TOKEN)
    env = child_env(settings, ChildKind.LOCAL_DRIVER, study=("0123456789ab", 3))
    assert "FEDTUNE_DATABASE_URL" not in env and "FEDTUNE_API_TOKEN" not in env
    assert env["FEDTUNE_DRIVER_URL"] == "http://127.0.0.1:8123"
    assert env["FEDTUNE_DRIVER_TOKEN"] == driver_token(code_url_key(settings), "0123456789ab", 3)
    assert not any(TOKEN in value for value in env.values())
    # without a URL the driver still writes the database itself
    plain = child_env(make_settings(backend="local"), ChildKind.LOCAL_DRIVER, study=("0" * 12, 1))
    assert "FEDTUNE_DATABASE_URL" in plain and "FEDTUNE_DRIVER_TOKEN" not in plain


def test_a_local_driver_without_code_on_a_shared_database_writes_it_itself(make_settings) -> None:
    """Replicas on one PostgreSQL database: a driver bound to its replica's URL would lose its
    service with that replica, while the one that takes over adopts the driver. A study without
    uploaded code runs no code of the member's, so its driver may hold the database URL; one
    with code still reports through the API (it runs in the sandbox)."""
    pg = "postgresql+psycopg://fedtune@127.0.0.1:5432/test"
    settings = make_settings(
        backend="local", driver_url="http://127.0.0.1:8123", database_url=pg, api_token=TOKEN
    )
    plain = child_env(settings, ChildKind.LOCAL_DRIVER, study=("0" * 12, 1), code=False)
    assert plain["FEDTUNE_DATABASE_URL"] == pg and "FEDTUNE_DRIVER_TOKEN" not in plain
    with_code = child_env(settings, ChildKind.LOCAL_DRIVER, study=("0" * 12, 1), code=True)
    assert "FEDTUNE_DATABASE_URL" not in with_code and "FEDTUNE_DRIVER_TOKEN" in with_code
