"""One-time start tickets (``fedtune.service.tickets``): a driver's start carries no credential.

Against the real app on a SQLite store (and, for the driver's own redemption, a real uvicorn
server in a thread): a ticket is exchanged once for the study's driver credential and its
project's MLflow login; a second redemption marks the attempt compromised, which revokes the
credential (401 on every driver route), shows on the study, and makes the scheduler stop the
attempt's driver and re-dispatch the study with a new attempt and a new ticket. Expired tickets
and tickets of another study open nothing, and nothing stores or logs a ticket or credential.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from fedtune.cli.remote import _show_status
from fedtune.client import Client
from fedtune.errors import ConflictError, InvalidTokenError
from fedtune.service import tickets
from fedtune.service.api import create_app
from fedtune.service.backends.base import DriverStatus, LaunchRequest
from fedtune.service.db import Database
from fedtune.service.driver import EXIT_REFUSED, run_driver
from fedtune.service.driver_start import MlflowLogin, tracking_uri_with_login
from fedtune.service.models import DriverTicket
from fedtune.service.repository import Repository
from fedtune.service.scheduler import Scheduler
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.settings import load_settings
from fedtune.service.states import StudyState
from tests.ports import free_port

from .conftest import TOKEN
from .helpers import FakeBackend, running_study, tiny_spec
from .test_driver import fake_run_study

ADMIN = {"Authorization": f"Bearer {TOKEN}"}
MLFLOW_ADMIN = "mlflow-admin-password-for-tickets-0123"


@pytest.fixture
def api(ctx: ServiceContext, make_settings) -> Iterator[tuple[TestClient, ServiceContext]]:
    """The app on the driver tests' database, with MLflow workspaces (drivers get a login)."""
    settings = make_settings(
        database_url=ctx.db.url,
        api_token=TOKEN,
        mlflow_tracking_uri="http://127.0.0.1:9",
        mlflow_workspaces=True,
        mlflow_admin_password=MLFLOW_ADMIN,
    )
    with TestClient(create_app(settings, backend=None, schedule=False)) as client:
        yield client, ServiceContext(ctx.db, settings)


def _issue(ctx: ServiceContext, sid: str, attempt: int = 1, ttl_s: float = 600) -> str:
    with ctx.db.session() as s:
        return tickets.issue(s, sid, attempt, ttl_s)


def _redeem(client: TestClient, sid: str, ticket: str):
    return client.post(
        f"/v1/driver/studies/{sid}/ticket", headers={"Authorization": f"Bearer {ticket}"}
    )


def _routes(client: TestClient, sid: str, token: str) -> dict[str, int]:
    """The status of every driver route for ``token``."""
    bearer = {"Authorization": f"Bearer {token}"}
    base = f"/v1/driver/studies/{sid}"
    end = {"state": "failed", "values": {"error": "forged"}}
    return {
        "claim": client.get(base, headers=bearer).status_code,
        "heartbeat": client.post(f"{base}/heartbeat", headers=bearer).status_code,
        "code": client.get(f"{base}/code", headers=bearer).status_code,
        "finish": client.post(f"{base}/finish", json=end, headers=bearer).status_code,
        "rounds": client.post(f"{base}/trials/0/rounds", json=[], headers=bearer).status_code,
    }


def test_a_ticket_is_exchanged_once_for_the_credential_and_the_mlflow_login(api, caplog) -> None:
    client, ctx = api
    sid = running_study(ctx)
    ticket = _issue(ctx, sid)
    caplog.set_level(logging.DEBUG)
    answer = _redeem(client, sid, ticket)
    assert answer.status_code == 200, answer.text
    assert answer.headers["cache-control"] == "no-store"
    body = answer.json()
    assert body["attempt"] == 1 and body["token"].startswith(tickets.TOKEN_PREFIX)
    # the project's MLflow driver login, never the admin's
    assert body["mlflow"]["username"] == "fedtune-driver-default"
    assert body["mlflow"]["password"] and body["mlflow"]["password"] != MLFLOW_ADMIN
    assert _routes(client, sid, body["token"])["claim"] == 200
    # the credential is no API token
    bearer = {"Authorization": f"Bearer {body['token']}"}
    assert client.get("/v1/studies", headers=bearer).status_code == 401
    # only digests are stored, and nothing logs the ticket or the credential
    with ctx.db.session(readonly=True) as s:
        rows = [tuple(r) for r in s.execute(select(DriverTicket.__table__)).all()]
    stored = repr(rows)
    assert ticket not in stored and body["token"] not in stored
    assert tickets.digest(ticket) in stored and tickets.digest(body["token"]) in stored
    for secret in (ticket, body["token"], body["mlflow"]["password"]):
        assert secret not in caplog.text


def test_a_ticket_redeemed_twice_revokes_the_credential_and_shows_on_the_study(api, caplog) -> None:
    client, ctx = api
    sid = running_study(ctx)
    ticket = _issue(ctx, sid)
    first = _redeem(client, sid, ticket)
    token = first.json()["token"]
    assert set(_routes(client, sid, token).values()) <= {200, 204, 404}  # 404: no code
    caplog.set_level(logging.DEBUG)
    again = _redeem(client, sid, ticket)  # whoever read it: before or after the driver
    assert again.status_code == 409, again.text
    assert "token" not in again.json() and "compromised" in again.json()["error"]["message"]
    # the credential it was exchanged for opens nothing any more
    assert set(_routes(client, sid, token).values()) == {401}
    assert _redeem(client, sid, ticket).status_code == 409  # and stays spent
    study = client.get(f"/v1/studies/{sid}", headers=ADMIN).json()
    [event] = study["events"]
    assert (event["kind"], event["attempt"]) == ("driver_ticket_reused", 1)
    assert "compromised" in event["message"]
    assert f"study {sid}: attempt 1's start ticket was redeemed a second time" in caplog.text
    assert ticket not in caplog.text and token not in caplog.text
    assert ticket not in repr(study) and token not in repr(study)
    # the SDK reads the event, and `fedtune status` shows it
    with Client("http://testserver", token=TOKEN, transport=client._transport) as sdk:
        status = sdk.study(sid).status()
    [seen] = status.events
    assert (seen.kind, seen.attempt, seen.message) == ("driver_ticket_reused", 1, event["message"])
    shown = [line for line in _show_status(status).splitlines() if line.startswith("event")]
    assert len(shown) == 1 and "attempt 1 was redeemed a second time" in shown[0]


def test_an_expired_or_foreign_ticket_opens_nothing_and_compromises_nothing(api) -> None:
    client, ctx = api
    mine, other = running_study(ctx), running_study(ctx, name="other")
    expired = _issue(ctx, mine, ttl_s=60)
    with ctx.db.session() as s:
        past = tickets.utcnow() - dt.timedelta(seconds=1)
        s.execute(update(DriverTicket).values(expires_at=past))
    answer = _redeem(client, mine, expired)
    assert answer.status_code == 401 and "expired" in answer.json()["error"]["message"]
    foreign = _issue(ctx, other)
    for sid, ticket in [
        (mine, foreign),  # another study's ticket on this study's route
        (mine, "ftt_" + "0" * 43),  # forged
        (mine, TOKEN),  # the admin's API token
    ]:
        assert _redeem(client, sid, ticket).status_code == 404, (sid, ticket)
    assert _redeem(client, mine, "").status_code == 401  # no ticket at all
    assert _redeem(client, other, foreign).status_code == 200  # the foreign one: still good
    with ctx.db.session(readonly=True) as s:
        assert tickets.events(s, mine) == [] and tickets.events(s, other) == []


def test_a_launch_request_never_shows_its_ticket() -> None:
    request = LaunchRequest("0123456789ab", 1, ticket="ftt_secret-ticket")
    assert "ftt_secret-ticket" not in repr(request) and "ftt_secret-ticket" not in str(request)
    with pytest.raises(ValueError) as refused:
        LaunchRequest("0123456789ab", 0, ticket="ftt_secret-ticket")
    assert "ftt_secret-ticket" not in str(refused.value)


def test_the_scheduler_stops_a_compromised_attempt_and_redispatches_with_a_new_ticket(
    sqlite_db: Database, make_settings, fake_backend: FakeBackend
) -> None:
    settings = make_settings(
        database_url=sqlite_db.url, driver_url="http://127.0.0.1:9", api_token=TOKEN
    )
    scheduler = Scheduler(sqlite_db, fake_backend, settings)
    ctx = ServiceContext(sqlite_db, settings, scheduler)
    sid = submit_study(ctx, tiny_spec())[0].id
    assert scheduler.tick().dispatched == [sid]
    [first] = fake_backend.launched
    assert first.ticket and first.ticket.startswith(tickets.TICKET_PREFIX)
    with TestClient(create_app(settings, backend=None, schedule=False)) as client:
        token = _redeem(client, sid, first.ticket).json()["token"]
        assert _redeem(client, sid, first.ticket).status_code == 409  # someone else's try
        # the driver is stopped first; the study stays running while it still runs
        fake_backend.stop_ends = False  # the driver takes a while to stop
        report = scheduler.tick()
        assert report.recovered == [] and report.dispatched == []
        assert fake_backend.stopped == [{"study": sid, "attempt": 1}]
        assert _study_state(ctx, sid) == (StudyState.RUNNING, 1)
        fake_backend.finish(sid, 1, DriverStatus.FAILED)  # it is gone now
        report = scheduler.tick()
        [recovery] = report.recovered
        assert recovery.action == "requeued" and "redeemed twice" in recovery.reason
        assert report.dispatched == [sid]  # a new attempt, a new ticket
        second = fake_backend.launched[-1]
        assert second.attempt == 2 and second.ticket not in (None, first.ticket)
        assert _study_state(ctx, sid) == (StudyState.RUNNING, 2)
        assert set(_routes(client, sid, token).values()) == {401}
        fresh = _redeem(client, sid, second.ticket)
        assert fresh.status_code == 200 and fresh.json()["attempt"] == 2
        assert _routes(client, sid, fresh.json()["token"])["claim"] == 200
        report = scheduler.tick()  # attempt 2 is not compromised: nothing happens to it
        assert report.recovered == [] and fake_backend.stopped == [{"study": sid, "attempt": 1}]


def _study_state(ctx: ServiceContext, sid: str) -> tuple[StudyState, int]:
    with ctx.db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
        return study.state, study.attempts


@pytest.fixture
def served(ctx: ServiceContext, make_settings) -> Iterator[tuple[str, ServiceContext]]:
    """The app served by a real uvicorn server in a thread; its URL."""
    settings = make_settings(database_url=ctx.db.url, api_token=TOKEN, heartbeat_s=0.05)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, backend=None, schedule=False),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    try:
        yield f"http://127.0.0.1:{port}", ServiceContext(ctx.db, settings)
    finally:
        server.should_exit = True
        thread.join(30)


def test_a_driver_redeems_its_ticket_and_a_spent_one_ends_it(served, make_settings) -> None:
    url, ctx = served
    sid = running_study(ctx)
    ticket = _issue(ctx, sid)
    settings = make_settings(
        database_url="sqlite:////nonexistent/never-opened.db",  # the driver uses the API only
        driver_url=url,
        driver_ticket=ticket,
        heartbeat_s=0.05,
    )
    assert run_driver(sid, settings, 1, run_study=fake_run_study) == 0
    with ctx.db.session(readonly=True) as s:
        assert Repository(s).require_study(sid).state == StudyState.SUCCEEDED
    # the same ticket again (a copy someone read): refused, and the attempt is marked
    other = running_study(ctx, name="other")
    spent = _issue(ctx, other)
    first = make_settings(driver_url=url, driver_ticket=spent, heartbeat_s=0.05)
    assert run_driver(other, first, 1, run_study=fake_run_study) == 0
    assert run_driver(other, first, 1, run_study=fake_run_study) == EXIT_REFUSED
    with ctx.db.session(readonly=True) as s:
        assert [e.attempt for e in tickets.events(s, other)] == [1]


def test_the_mlflow_login_goes_into_the_tracking_uri_only() -> None:
    login = MlflowLogin("fedtune-driver-lab", "p@ss/word:1")
    uri = tracking_uri_with_login("http://mlflow.example:5000/base", login)
    assert uri == "http://fedtune-driver-lab:p%40ss%2Fword%3A1@mlflow.example:5000/base"
    assert "p@ss" not in repr(login)
    # a file store or no login: unchanged
    assert tracking_uri_with_login("sqlite:////w/mlflow.db", login) == "sqlite:////w/mlflow.db"
    assert tracking_uri_with_login("https://m:5000", None) == "https://m:5000"


def test_one_of_two_redemptions_at_once_wins_on_each_database(database: Database) -> None:
    """The compare-and-set on ``redeemed_at``: two redemptions racing, on SQLite and on
    PostgreSQL, give one credential; the other marks the attempt compromised, which revokes it."""
    ctx = ServiceContext(database, load_settings(database_url=database.url))
    sid = running_study(ctx)
    ticket = _issue(ctx, sid)
    barrier = threading.Barrier(2)
    results: list[object] = []

    def redeem() -> None:
        barrier.wait()
        try:
            results.append(tickets.redeem(database, sid, ticket))
        except ConflictError as exc:
            results.append(exc)

    racers = [threading.Thread(target=redeem) for _ in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(60)
    won = [r for r in results if isinstance(r, tickets.Redeemed)]
    assert len(won) == 1 and len(results) == 2, results
    with database.session(readonly=True) as s:
        assert [e.attempt for e in tickets.events(s, sid)] == [1]
        assert tickets.compromised_running(s) == [(sid, 1)]
        with pytest.raises(InvalidTokenError):
            tickets.verify(s, sid, won[0].token)
