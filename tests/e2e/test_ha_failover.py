"""Two real ``fedtune serve`` replicas on one PostgreSQL database.

Both serve the API; exactly one leads the scheduler (``fedtune_scheduler_leader`` 1 on it, 0 on
the other). ``kill -9`` of the leader while studies run and wait: the other replica takes the
lease over (fencing token + 1) within 15 s, every study still finishes with exactly its trials,
and no study was dispatched twice (one attempt each: the new leader finds the running drivers
alive and adopts them). On SQLite a second process refuses to run a scheduler, with one line.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from fedtune.client import Client
from fedtune.service.db import Database
from fedtune.service.states import StudyState
from tests.needs import need
from tests.service.helpers import Server, pg_schema, pg_unreachable_reason, tiny_spec, until

pytestmark = pytest.mark.slow

TOKEN = "ha-token-0123456789abcdef"


def _leader(server: Server) -> int | None:
    try:
        body = httpx.get(f"{server.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    found = re.search(r"^fedtune_scheduler_leader ([0-9.]+)$", body, flags=re.MULTILINE)
    return int(float(found.group(1))) if found else None


def _servers(tmp_path: Path, url: str, n: int = 2) -> list[Server]:
    env = {
        "FEDTUNE_DATABASE_URL": url,
        "FEDTUNE_WORKDIR": str(tmp_path / "work"),
        "FEDTUNE_BACKEND": "local",
        "FEDTUNE_API_TOKEN": TOKEN,
        "FEDTUNE_MAX_CONCURRENT_STUDIES": "2",
        "FEDTUNE_SCHEDULER_INTERVAL_S": "0.5",
        "FEDTUNE_HEARTBEAT_S": "1",
        "FEDTUNE_LEADER_LEASE_S": "4",
    }
    return [Server(env, tmp_path / f"serve-{i}.log") for i in range(n)]


def test_one_leader_and_a_failover_within_15_s_with_no_study_dispatched_twice(tmp_path) -> None:
    need("postgres", pg_unreachable_reason())
    with pg_schema() as url:
        servers = _servers(tmp_path, url)
        try:
            for server in servers:
                server.start(timeout=120)
            flags = until(
                lambda: (f := [_leader(s) for s in servers]) and sorted(f) == [0, 1] and f,
                30,
                every=0.2,
            )
            assert flags, "timed out waiting for exactly one leader"
            leader, other = (servers[0], servers[1]) if flags[0] == 1 else (servers[1], servers[0])
            client = Client(other.url, token=TOKEN, retries=2)
            # three studies, two slots: at the kill some run (the new leader adopts them) and at
            # least one waits (the new leader dispatches it), each exactly once; every study is
            # a driver with its own embedded Ray (~20 CPU-s), so no more than that
            ids = [
                client.submit(tiny_spec(name=f"ha{i}", trials=2, rounds=40)).id for i in range(3)
            ]
            assert until(
                lambda: sum(client.study(i).status().state == StudyState.RUNNING for i in ids) >= 1,
                120,
                every=0.2,
            ), "no running study"
            db = Database(url)
            with db.session(readonly=True) as s:
                token_before = s.execute(text("SELECT token FROM scheduler_lease")).scalar()
            killed_at = time.monotonic()
            leader.kill9()
            assert until(lambda: _leader(other) == 1, 30, every=0.2), "the other did not lead"
            failover_s = time.monotonic() - killed_at
            print(f"failover after kill -9 of the leader: {failover_s:.1f} s")
            assert failover_s < 15.0
            with db.session(readonly=True) as s:
                token_after = s.execute(text("SELECT token FROM scheduler_lease")).scalar()
            assert token_after == token_before + 1  # a new holder: a new fencing token
            finals = [client.study(i).wait(progress=False, timeout=600, poll_s=1.0) for i in ids]
            for final in finals:
                assert final.state == StudyState.SUCCEEDED, (final.id, final.error)
                assert final.attempts == 1, (final.id, final.attempts, final.error)
                assert final.progress.completed == 2
                numbers = [t.number for t in client.study(final.id).trials()]
                assert sorted(numbers) == [0, 1]
            client.close()
            db.dispose()
        finally:
            for server in servers:
                server.stop()


def test_a_second_process_on_one_sqlite_file_serves_but_does_not_schedule(tmp_path) -> None:
    servers = _servers(tmp_path, f"sqlite:///{tmp_path / 'one.db'}")
    try:
        first = servers[0].start(timeout=120)
        assert until(lambda: _leader(first) == 1, 30, every=0.2), "the first does not schedule"
        second = servers[1].start(timeout=120)
        assert _leader(second) == 0 and _leader(first) == 1
        refusals = [
            line
            for line in servers[1].log.read_text().splitlines()
            if "scheduler not started" in line
        ]
        assert len(refusals) == 1 and "SQLite" in refusals[0]
        assert (
            httpx.get(
                f"{second.url}/v1/studies", headers={"Authorization": f"Bearer {TOKEN}"}
            ).status_code
            == 200
        )
    finally:
        for server in servers:
            server.stop()
