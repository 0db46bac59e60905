"""A driver that reports through the service's API with its study's own credential.

The same stand-in ``run_study`` as ``test_driver.py``, with the driver's link an
:class:`~fedtune.service.driver_link.ApiLink` to a real app on the same database, its credential
the one its start ticket was exchanged for (``POST …/ticket``): what it records is what the
database link records, and the credential opens that study's attempt only.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from fedtune.service import tickets
from fedtune.service.api import create_app
from fedtune.service.child_env import ChildKind, child_env
from fedtune.service.driver import run_driver
from fedtune.service.driver_link import ApiLink
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


def redeemed(client: TestClient, ctx: ServiceContext, sid: str, attempt: int = 1) -> str:
    """The driver credential a new start ticket of ``sid``'s ``attempt`` is exchanged for."""
    with ctx.db.session() as s:
        ticket = tickets.issue(s, sid, attempt, ttl_s=600)
    answer = client.post(
        f"/v1/driver/studies/{sid}/ticket", headers={"Authorization": f"Bearer {ticket}"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["attempt"] == attempt
    return answer.json()["token"]


def _link(client: TestClient, ctx: ServiceContext, sid: str, attempt: int = 1) -> ApiLink:
    return ApiLink(BASE, sid, redeemed(client, ctx, sid, attempt), client=client)


def test_a_driver_records_its_study_through_the_api(api) -> None:
    client, ctx = api
    sid = running_study(ctx)
    link = _link(client, ctx, sid)
    with ctx.db.session() as s:  # the study's owner reaches the driver with its claim
        s.get(Study, sid).owner = "alice"
    assert run_driver(sid, ctx.settings, 1, run_study=fake_run_study, link=link) == 0
    assert_fake_study_recorded(ctx, sid)
    assert fake_run_study.seen["run_user"] == "alice"


def test_a_driver_token_opens_its_own_study_and_attempt_only(api) -> None:
    client, ctx = api
    mine, other = running_study(ctx), running_study(ctx, name="other")
    token = redeemed(client, ctx, mine)
    bearer = {"Authorization": f"Bearer {token}"}
    assert client.get(f"/v1/driver/studies/{mine}", headers=bearer).json()["attempts"] == 1
    # another study, a forged token, the admin's API token, none: all the same 404
    for sid, headers in [
        (other, bearer),
        (mine, {"Authorization": "Bearer ftd_" + "0" * 43}),
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
    bearer = {"Authorization": f"Bearer {redeemed(client, ctx, sid)}"}
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


def test_a_local_driver_gets_a_start_ticket_and_no_credential(make_settings) -> None:
    settings = make_settings(
        backend="local",
        driver_url="http://127.0.0.1:8123",
        api_token=TOKEN,
        mlflow_tracking_uri="http://127.0.0.1:5000",
        mlflow_workspaces=True,
        mlflow_admin_password="mlflow-admin-password-0123",
    )
    env = child_env(settings, ChildKind.LOCAL_DRIVER, project="lab", ticket="ftt_one-time")
    assert "FEDTUNE_DATABASE_URL" not in env and "FEDTUNE_API_TOKEN" not in env
    assert env["FEDTUNE_DRIVER_URL"] == "http://127.0.0.1:8123"
    assert env["FEDTUNE_DRIVER_TICKET"] == "ftt_one-time"
    # the MLflow login comes with the ticket's redemption; the workspace is no secret
    assert env["MLFLOW_WORKSPACE"] == "lab"
    assert "MLFLOW_TRACKING_PASSWORD" not in env and "MLFLOW_TRACKING_USERNAME" not in env
    assert not any(TOKEN in value for value in env.values())
    # without a URL the driver still writes the database itself, with its login in its env
    plain = child_env(
        make_settings(
            backend="local",
            mlflow_tracking_uri="http://127.0.0.1:5000",
            mlflow_workspaces=True,
            mlflow_admin_password="mlflow-admin-password-0123",
        ),
        ChildKind.LOCAL_DRIVER,
        project="lab",
        ticket="ftt_one-time",
    )
    assert "FEDTUNE_DATABASE_URL" in plain and "FEDTUNE_DRIVER_TICKET" not in plain
    assert plain["MLFLOW_TRACKING_USERNAME"] == "fedtune-driver-lab"


def test_a_local_driver_without_code_on_a_shared_database_writes_it_itself(make_settings) -> None:
    """Replicas on one PostgreSQL database: a driver bound to its replica's URL would lose its
    service with that replica, while the one that takes over adopts the driver. A study without
    uploaded code runs no code of the member's, so its driver may hold the database URL; one
    with code still reports through the API (it runs in the sandbox)."""
    pg = "postgresql+psycopg://fedtune@127.0.0.1:5432/test"
    settings = make_settings(
        backend="local", driver_url="http://127.0.0.1:8123", database_url=pg, api_token=TOKEN
    )
    plain = child_env(settings, ChildKind.LOCAL_DRIVER, ticket="ftt_x", code=False)
    assert plain["FEDTUNE_DATABASE_URL"] == pg and "FEDTUNE_DRIVER_TICKET" not in plain
    with_code = child_env(settings, ChildKind.LOCAL_DRIVER, ticket="ftt_x", code=True)
    assert "FEDTUNE_DATABASE_URL" not in with_code and with_code["FEDTUNE_DRIVER_TICKET"] == "ftt_x"
