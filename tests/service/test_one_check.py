"""One check per submission (issue 59, requirement 7).

A submission with uploaded code is checked in a sandbox for up to FEDTUNE_CODE_CHECK_TIMEOUT_S.
A retry with the same Idempotency-Key that arrives while that check runs waits for its answer
instead of starting a second sandboxed check (``fedtune.service.idempotency``); the SDK waits
for a submission's answer longer than the service's check may take, so it sends no retry into
a running check. Checks are counted by the line the service logs when it starts one (a real
``fedtune serve``, a real bubblewrap sandbox). The retry tests' package holds its check at
import until the retry is seen waiting (the line the service logs then), so every retry
provably arrives during the check (a fixed sleep at import cost 4 s a test and only made that
likely); the SDK's test's package sleeps longer than the SDK's own timeout.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from fedtune.client import SUBMIT_MARGIN_S, Client
from fedtune.code_package import pack
from fedtune.service import idempotency
from fedtune.service.api import create_app
from fedtune.service.models import IdempotencyClaim, utcnow

from .code_fixtures import GOOD_TASKS, write_package
from .conftest import TOKEN
from .helpers import FakeBackend, Server, pg_schema, tiny_spec, until

AUTH = {"Authorization": f"Bearer {TOKEN}"}
#: what the service logs when it starts the sandboxed check of a submission's code
CHECK_LINE = "code check of package"
#: what the service logs when a request with a claimed key starts waiting for that key's check
WAIT_LINE = "waiting for the check of the request that claimed it"
#: the SDK's own timeout in the SDK's test, and how long its package sleeps at import: longer
SDK_TIMEOUT_S, SDK_SLOW_S = 2.0, 2.5
#: the longest a held check waits for :func:`_release` (the check's own bound is 60 s)
HOLD_S = 50
#: at import, the check waits for a file ``go`` beside its answer (its ``out`` folder, which the
#: test can write into) before it goes on: :func:`_release` writes it once the retry waits
HELD = f"""
import os, sys, time
_go = os.path.join(os.path.dirname(sys.argv[-1]), "go")
_until = time.monotonic() + {HOLD_S}
while not os.path.exists(_go) and time.monotonic() < _until:
    time.sleep(0.05)
"""


def _held_package(root: Path) -> bytes:
    return pack(write_package(root, f"{HELD}{GOOD_TASKS}")).data


def _release(workdir: Path) -> None:
    """Let every check held at import (:data:`HELD`) under ``workdir`` go on."""
    outs = until(lambda: list(workdir.rglob("code-check-*/out")), timeout=60, every=0.05)
    assert outs, f"no running check under {workdir}"
    for out in outs:
        (out / "go").write_text("")


def _workdir(server: Server) -> Path:
    return Path(server.env["FEDTUNE_WORKDIR"])


def _code_spec(sha: str) -> dict:
    spec = tiny_spec(name="one-check", code={"sha256": sha, "modules": ["user_lab.tasks"]})
    spec["task"] = {**spec["task"], "name": "user_quadratic"}
    return spec


def _checks(*logs: Path) -> int:
    return sum(log.read_text().count(CHECK_LINE) for log in logs)


def _serve(tmp_path: Path, name: str, database_url: str, **extra: str) -> Server:
    env = {
        "FEDTUNE_DATABASE_URL": database_url,
        "FEDTUNE_WORKDIR": str(tmp_path / f"work-{name}"),
        "FEDTUNE_BACKEND": "none",
        "FEDTUNE_API_TOKEN": TOKEN,
        "FEDTUNE_ALLOW_CODE_UPLOAD": "true",
        **extra,
    }
    return Server(env, tmp_path / f"{name}.log").start(timeout=180)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        server.stop()


def _submit_twice(first: Server, second: Server, spec: dict, key: str) -> list[httpx.Response]:
    """POST the same submission to ``first``, then, once its check has started, to ``second``;
    once ``second`` logs that the retry waits, release the check (:func:`_release`)."""
    answers: list[httpx.Response] = []

    def post(server: Server) -> None:
        headers = {**AUTH, "Idempotency-Key": key}
        answers.append(
            httpx.post(f"{server.url}/v1/studies", json=spec, headers=headers, timeout=180)
        )

    one = threading.Thread(target=post, args=(first,))
    one.start()
    assert until(lambda: _checks(first.log) == 1, timeout=60, every=0.1), "no check started"
    two = threading.Thread(target=post, args=(second,))
    two.start()
    waited = until(lambda: WAIT_LINE in second.log.read_text(), timeout=HOLD_S - 10, every=0.05)
    _release(_workdir(first))
    assert waited, "the retry did not wait for the running check"
    one.join(200)
    two.join(200)
    return answers


def test_a_retry_during_the_check_waits_for_it_instead_of_checking_again(
    tmp_path: Path, servers: list[Server]
) -> None:
    server = _serve(tmp_path, "serve", f"sqlite:///{tmp_path / 'fedtune.db'}")
    servers.append(server)
    sha = httpx.post(
        f"{server.url}/v1/code",
        content=_held_package(tmp_path / "lab"),
        headers={**AUTH, "Content-Type": "application/zip"},
    ).json()["sha256"]
    answers = _submit_twice(server, server, _code_spec(sha), "retried-during-check")
    assert sorted(a.status_code for a in answers) == [200, 201], [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1  # one study
    replayed = next(a for a in answers if a.status_code == 200)
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert _checks(server.log) == 1  # one sandboxed check, not two


def test_one_check_across_two_replicas_of_one_database(
    tmp_path: Path, servers: list[Server], pg_available: None
) -> None:
    with pg_schema() as url:
        first = _serve(tmp_path, "replica-a", url)
        servers.append(first)
        second = _serve(tmp_path, "replica-b", url, FEDTUNE_MIGRATE_ON_START="false")
        servers.append(second)
        sha = httpx.post(
            f"{first.url}/v1/code",
            content=_held_package(tmp_path / "lab"),
            headers={**AUTH, "Content-Type": "application/zip"},
        ).json()["sha256"]
        answers = _submit_twice(first, second, _code_spec(sha), "retried-on-another-replica")
        for server in servers:
            server.stop()
    assert sorted(a.status_code for a in answers) == [200, 201], [a.text for a in answers]
    assert len({a.json()["id"] for a in answers}) == 1
    assert _checks(first.log, second.log) == 1


def test_the_sdk_waits_for_a_check_longer_than_its_own_timeout(
    tmp_path: Path, servers: list[Server]
) -> None:
    server = _serve(tmp_path, "serve", f"sqlite:///{tmp_path / 'fedtune.db'}")
    servers.append(server)
    sleeps: list[float] = []
    # each answer is awaited 2 s; the check takes longer (the package sleeps 2.5 s at import)
    with Client(server.url, token=TOKEN, timeout=SDK_TIMEOUT_S, sleep=sleeps.append) as sdk:
        body = f"import time\ntime.sleep({SDK_SLOW_S})\n{GOOD_TASKS}"
        lab = write_package(tmp_path / "lab", body)
        spec = {**_code_spec("0" * 64), "code": {"path": str(lab), "modules": ["user_lab.tasks"]}}
        started = time.monotonic()
        study = sdk.submit(spec)
        assert time.monotonic() - started > SDK_TIMEOUT_S  # the answer came after 2 s
        assert sdk.check_bound_s == 60.0  # the service's FEDTUNE_CODE_CHECK_TIMEOUT_S, as told
        assert sdk.submit_timeout().read == 60.0 + SUBMIT_MARGIN_S
        assert study.status().code_sha256
    assert sleeps == []  # no attempt failed: nothing was retried into the running check
    assert _checks(server.log) == 1


# ---------------------------------------------------------------- in one process


@pytest.fixture
def make_app(make_settings: Callable, monkeypatch) -> Iterator[Callable[..., TestClient]]:
    monkeypatch.setattr(idempotency, "CLAIM_MARGIN_S", 0.5)  # the claim's margin: 0.5 s
    clients: list[TestClient] = []

    def make(**overrides) -> TestClient:
        settings = make_settings(api_token=TOKEN, allow_code_upload=True, **overrides)
        client = TestClient(create_app(settings, backend=FakeBackend(), schedule=False))
        client.headers.update(AUTH)
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def _uploaded(tc: TestClient, root: Path, body: str = GOOD_TASKS) -> str:
    data = pack(write_package(root, body)).data
    answer = tc.post("/v1/code", content=data, headers={"Content-Type": "application/zip"})
    return answer.json()["sha256"]


def _claim(tc: TestClient, key: str, spec: dict, age_s: float, answer=None) -> None:
    """A claim of ``key`` as another replica would hold it, claimed ``age_s`` ago."""
    from fedtune.service.specs import request_hash

    claimed_at = utcnow() - dt.timedelta(seconds=age_s)
    with tc.app.state.runtime.db.session() as session:
        session.add(
            IdempotencyClaim(
                key=key, request_hash=request_hash(spec), claimed_at=claimed_at, answer=answer
            )
        )


def test_a_check_still_running_elsewhere_is_a_409_with_retry_after(
    make_app: Callable, tmp_path: Path, caplog
) -> None:
    app_client = make_app(code_check_timeout_s=1)  # a retry waits 1 + 0.5 s at most
    spec = _code_spec(_uploaded(app_client, tmp_path / "lab"))
    _claim(app_client, "held", spec, age_s=0)
    with caplog.at_level(logging.INFO, logger="fedtune.service.code_services"):
        r = app_client.post("/v1/studies", json=spec, headers={"Idempotency-Key": "held"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "submission_in_progress"
    assert r.headers["Retry-After"] == "5" and "still being checked" in r.text
    assert CHECK_LINE not in caplog.text  # it waited; it did not check


def test_a_stale_claim_is_taken_over_and_a_refusal_is_replayed(
    make_app: Callable, tmp_path: Path, caplog
) -> None:
    app_client = make_app()  # the check's bound: 60 + 0.5 s, stale after twice that
    spec = _code_spec(_uploaded(app_client, tmp_path / "lab"))
    _claim(app_client, "stale", spec, age_s=200)  # its replica died during the check
    with caplog.at_level(logging.INFO, logger="fedtune.service.code_services"):
        r = app_client.post("/v1/studies", json=spec, headers={"Idempotency-Key": "stale"})
    assert r.status_code == 201, r.text
    assert caplog.text.count(CHECK_LINE) == 1
    error = {"code": "invalid_code", "message": "no", "field": "code.modules[0]"}
    refusal = {"status": 422, "body": {"error": error}}
    _claim(app_client, "refused", spec, age_s=1, answer=refusal)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="fedtune.service.code_services"):
        again = app_client.post("/v1/studies", json=spec, headers={"Idempotency-Key": "refused"})
    assert again.status_code == 422 and again.json()["error"] == error
    assert CHECK_LINE not in caplog.text
    other = {**spec, "name": "another-body"}
    reused = app_client.post("/v1/studies", json=other, headers={"Idempotency-Key": "refused"})
    assert reused.status_code == 409 and reused.json()["error"]["code"] == "idempotency_key_reused"


def test_concurrent_retries_of_a_refused_submission_share_its_one_check(
    make_app: Callable, tmp_path: Path, caplog
) -> None:
    tc = make_app()
    # the import fails once the retry waits: its 422 is the answer of every request with the key
    body = f"{HELD}raise RuntimeError('the lab refuses')\n"
    with caplog.at_level(logging.INFO):
        spec = _code_spec(_uploaded(tc, tmp_path / "lab", body))
        answers: list[httpx.Response] = []

        def post() -> None:
            headers = {"Idempotency-Key": "refused-once"}
            answers.append(tc.post("/v1/studies", json=spec, headers=headers))

        threads = [threading.Thread(target=post) for _ in range(2)]
        threads[0].start()
        assert until(lambda: CHECK_LINE in caplog.text, timeout=60, every=0.1)
        threads[1].start()
        waited = until(lambda: WAIT_LINE in caplog.text, timeout=HOLD_S - 10, every=0.05)
        _release(tmp_path)
        assert waited, "the retry did not wait for the running check"
        for thread in threads:
            thread.join(120)
        late = tc.post("/v1/studies", json=spec, headers={"Idempotency-Key": "refused-once"})
    assert [a.status_code for a in answers] == [422, 422]
    assert answers[0].json() == answers[1].json() == late.json()
    assert "the lab refuses" in answers[0].json()["error"]["message"]
    assert caplog.text.count(CHECK_LINE) == 1
