"""benchmarks/service_load.py is robust: it fails loudly when the server never gets ready,
records errors instead of losing client threads, and always writes its JSON."""

from __future__ import annotations

import contextlib
import json
import sys
import time

import httpx
import pytest

from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("service_load.py")


def test_a_server_that_never_gets_ready_fails_loudly(bench, tmp_path) -> None:
    never = [sys.executable, "-c", "import time; time.sleep(120)"]  # alive, never serving
    t0 = time.monotonic()
    with (
        pytest.raises(bench.ServerNotReady, match="not ready"),
        bench.server("sqlite://", tmp_path, ready_timeout=3, argv=never),
    ):
        pytest.fail("the benchmark went on against a server that never got ready")
    assert time.monotonic() - t0 < 60


def test_a_server_that_exits_is_reported_with_its_log(bench, tmp_path) -> None:
    dies = [sys.executable, "-c", "import sys; print('boom: no database'); sys.exit(3)"]
    with (
        pytest.raises(bench.ServerNotReady, match="exited with 3: boom"),
        bench.server("sqlite://", tmp_path, ready_timeout=60, argv=dies),
    ):
        pass


def test_failing_calls_are_recorded_not_lost(bench) -> None:
    def call(client: httpx.Client, i: int) -> httpx.Response:
        if i % 2:
            raise httpx.ConnectError("connection refused")
        return httpx.Response(500)

    result = bench.measure("http://127.0.0.1:9", call, n=10, threads=3)
    assert result["requests"] == 10 and result["errors"] == 10
    assert result["error_samples"] == ["ConnectError: connection refused", "HTTP 500"]


def test_the_json_is_written_when_a_store_fails(bench, tmp_path, monkeypatch) -> None:
    @contextlib.contextmanager
    def broken(*args, **kwargs):
        raise bench.ServerNotReady("server exited with 1: no such database")
        yield  # pragma: no cover

    monkeypatch.setattr(bench, "server", broken)
    out = tmp_path / "load.json"
    monkeypatch.setattr(
        sys, "argv", ["service_load.py", "--stores", "sqlite", "--output", str(out)]
    )
    assert bench.main() == 1
    report = json.loads(out.read_text())
    assert report["stores"]["sqlite"] == {
        "failed": "ServerNotReady: server exited with 1: no such database"
    }
    assert report["environment"]["machine"]
