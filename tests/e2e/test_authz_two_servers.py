"""The route × role × ownership matrix against two real ``fedtune serve``
processes on one PostgreSQL database.

The same expectations as ``tests/service/test_authorization.py`` (every route of the OpenAPI
document, roles admin / member / viewer / other project / no token / revoked / expired), but
each request goes to one of two uvicorn servers in turn: a token made or revoked through one
replica is honoured by the other at once (nothing is cached per process), and both hold to the
404 rule. Users and projects are made on the database as ``fedtune users``/``projects`` do.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest

from fedtune.service.db import Database
from tests.needs import need
from tests.service.helpers import Server, pg_schema, pg_unreachable_reason
from tests.service.test_authorization import EXPECTED, TOKEN, World, run_matrix

pytestmark = pytest.mark.slow


class RoundRobin:
    """An httpx-like client whose requests alternate between several servers."""

    def __init__(self, urls: list[str]) -> None:
        self.clients = [httpx.Client(base_url=u, timeout=60) for u in urls]
        self._next = itertools.cycle(self.clients)
        self.hits = dict.fromkeys(urls, 0)

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        client = next(self._next)
        self.hits[str(client.base_url).rstrip("/")] += 1
        return client.request(method, url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def close(self) -> None:
        for c in self.clients:
            c.close()


def test_the_authorization_matrix_holds_on_two_replicas(tmp_path: Path) -> None:
    need("postgres", pg_unreachable_reason())
    with pg_schema() as url:
        env = {
            "FEDTUNE_DATABASE_URL": url,
            "FEDTUNE_WORKDIR": str(tmp_path / "work"),
            "FEDTUNE_BACKEND": "none",
            "FEDTUNE_API_TOKEN": TOKEN,
            "FEDTUNE_ALLOW_CODE_UPLOAD": "true",
        }
        servers = [Server(env, tmp_path / f"serve-{i}.log") for i in range(2)]
        client = None
        db = Database(url)
        try:
            for server in servers:
                server.start(timeout=120)
            client = RoundRobin([s.url for s in servers])
            world = World(client, db)
            with db.session() as s:
                from fedtune.service import identity

                identity.create_user(s, "nemo")
            world.sid = world.study()
            wrong = run_matrix(world)
            assert not wrong, "\n".join(wrong)
            assert all(n > len(EXPECTED) for n in client.hits.values())  # both answered
            # a token revoked through one replica is refused by the other at once
            made = client.post(
                "/v1/users/mia/tokens", json={}, headers=world.headers("admin")
            ).json()
            bearer = {"Authorization": f"Bearer {made['token']}"}
            assert client.get("/v1/whoami", headers=bearer).status_code == 200
            client.post(
                "/v1/users/mia/revoke",
                json={"token_id": made["token_id"]},
                headers=world.headers("admin"),
            )
            answers = {client.get("/v1/whoami", headers=bearer).status_code for _ in range(4)}
            assert answers == {401}
        finally:
            if client is not None:
                client.close()
            for server in servers:
                server.stop()
            db.dispose()
