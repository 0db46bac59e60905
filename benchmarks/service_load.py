"""Load on the service's API + database path: submission and status-read latency and throughput.

For each store — SQLite (a file, WAL) and PostgreSQL (a fresh schema, dropped afterwards;
skipped with the reason when the server cannot be reached) — it starts ``fedtune serve`` in a
subprocess with ``FEDTUNE_BACKEND=none`` (studies are accepted and stay queued: no driver, no
Ray, so the numbers are the HTTP + validation + transaction path alone) and a bearer token, then:

* ``submit``: ``POST /v1/studies`` (a small quadratic spec, distinct names, an Idempotency-Key
  each), first one request at a time (latency), then from ``--concurrency`` client threads
  (throughput);
* ``status``: ``GET /v1/studies/{id}`` of random submitted studies, the same two ways;
* ``list``: ``GET /v1/studies?limit=50``, one at a time.

* ``cold start``: seconds from process start to ``/readyz`` = 200 and the latency of the first
  submission after that (the service loads the tuning stack before it says ready).

Each client thread has its own keep-alive ``httpx.Client``. Reports p50/p90/p99/max latency
(ms) and requests/s; a non-2xx answer or an exception in a client thread is counted and sampled
in ``errors`` (never a lost thread). A server that never gets ready fails loudly. The JSON
(``benchmarks/results/service_load.json``, machine, versions, settings) is written whatever
happens; the exit code is 1 when any store failed. Usage:
``python benchmarks/service_load.py [--requests 300] [--concurrency 8] [--stores sqlite postgresql]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

from fedtune.service.testing import temporary_pg_schema

PG_URL = os.environ.get("FEDTUNE_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
TOKEN = "benchmark-token-0123456789abcdef"
OUT = Path(__file__).resolve().parent / "results" / "service_load.json"


def spec(i: int) -> dict:
    return {
        "name": f"load-{i}",
        "task": {"name": "quadratic", "clients": 8, "dim": 4},
        "algorithm": "fedavg",
        "train": {"rounds": 10, "clients_per_round": 4, "local_steps": 2, "batch_size": 4},
        "objective": {"last_rounds": 2},
        "scheduler": {"name": "none"},
        "budget": {"trials": 4},
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerNotReady(RuntimeError):
    """The server exited, or did not answer ``/readyz`` = 200 within the time limit."""


@contextlib.contextmanager
def server(
    url: str, workdir: Path, *, ready_timeout: float = 300.0, argv: list[str] | None = None
) -> Iterator[str]:
    """A ``fedtune serve`` process on a free port; yields its base URL once ready (the start-up
    seconds are in ``server.ready_s``). ``argv`` replaces the command (tests)."""
    port = free_port()
    env = {
        **os.environ,
        "FEDTUNE_DATABASE_URL": url,
        "FEDTUNE_BACKEND": "none",
        "FEDTUNE_API_TOKEN": TOKEN,
        "FEDTUNE_WORKDIR": str(workdir),
    }
    argv = argv or [
        sys.executable,
        "-m",
        "fedtune.cli",
        "serve",
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    log_path = workdir / f"serve-{port}.log"
    log = log_path.open("wb")
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(proc, base, start + ready_timeout, log_path)
        server.ready_s = round(time.monotonic() - start, 3)  # type: ignore[attr-defined]
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


def _wait_ready(proc: subprocess.Popen, base: str, deadline: float, log_path: Path) -> None:
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/readyz", timeout=5).status_code == 200:
                return
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace")[-500:].strip()
            raise ServerNotReady(f"server exited with {proc.returncode}: {tail}")
        time.sleep(0.2)
    raise ServerNotReady(f"server at {base} not ready (GET /readyz = 200) in time; log: {log_path}")


def pg_schema():
    """A fresh schema; yields a URL whose search_path is that schema; drops it afterwards."""
    return temporary_pg_schema(PG_URL, "fedtune_bench")


def pg_version() -> str | None:
    from sqlalchemy import create_engine, text

    with contextlib.suppress(Exception):
        engine = create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            return str(conn.execute(text("SHOW server_version")).scalar())
    return None


Call = Callable[[httpx.Client, int], httpx.Response]


def measure(base: str, call: Call, n: int, threads: int) -> dict:
    """``n`` calls spread over ``threads`` clients: latency percentiles (ms) and requests/s."""
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    counter = iter(range(n))

    def worker() -> None:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                t0 = time.perf_counter()
                try:
                    answer = call(client, i)
                    failure = None if answer.is_success else f"HTTP {answer.status_code}"
                except Exception as exc:  # a failed call is a data point, not a lost thread
                    failure = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                dt = time.perf_counter() - t0
                with lock:
                    latencies.append(dt)
                    if failure is not None:
                        failures.append(failure)

    start = time.perf_counter()
    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - start
    ms = np.asarray(latencies) * 1000
    return {
        "requests": n,
        "clients": threads,
        "errors": len(failures),
        "error_samples": sorted(set(failures))[:5],
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p90_ms": round(float(np.percentile(ms, 90)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
        "throughput_rps": round(n / wall, 1),
    }


def run_store(name: str, url: str, args: argparse.Namespace, workdir: Path) -> dict:
    ids: list[str] = []
    offset = iter(range(10**9))

    def submit(client: httpx.Client, i: int) -> httpx.Response:
        k = next(offset)
        answer = client.post("/v1/studies", json=spec(k), headers={"Idempotency-Key": f"k{k}"})
        if answer.is_success:
            ids.append(answer.json()["id"])
        return answer

    def status(client: httpx.Client, i: int) -> httpx.Response:
        return client.get(f"/v1/studies/{random.choice(ids)}")

    def listing(client: httpx.Client, i: int) -> httpx.Response:
        return client.get("/v1/studies", params={"limit": 50})

    with server(url, workdir) as base:
        first = measure(base, submit, 1, 1)  # the first submission after /readyz said ready
        cold = {
            "ready_s": server.ready_s,
            "first_submit_ms": first["p50_ms"],  # type: ignore[attr-defined]
            "first_submit_errors": first["errors"],
        }
        measure(base, submit, 20, 1)  # warm-up: connection pools, first pages
        results = {
            "cold_start": cold,
            "submit_sequential": measure(base, submit, args.requests, 1),
            "submit_concurrent": measure(base, submit, args.requests, args.concurrency),
            "status_sequential": measure(base, status, args.requests, 1),
            "status_concurrent": measure(base, status, args.requests, args.concurrency),
            "list_sequential": measure(base, listing, max(50, args.requests // 4), 1),
        }
    results["studies_in_store"] = len(ids)
    print(
        f"{name}: "
        + ", ".join(
            f"{k} p50 {v['p50_ms']} ms p99 {v['p99_ms']} ms {v['throughput_rps']}/s"
            for k, v in results.items()
            if isinstance(v, dict) and "p50_ms" in v
        )
    )
    print(f"{name}: ready after {cold['ready_s']} s, first submission {cold['first_submit_ms']} ms")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--stores", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"]
    )
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    random.seed(0)
    report: dict = {
        "benchmark": "service_load",
        "environment": environment(),
        "settings": {
            "requests": args.requests,
            "concurrency": args.concurrency,
            "backend": "none (studies stay queued; API + database path only)",
            "auth": "bearer token",
            "server": "fedtune serve (uvicorn, 1 process)",
        },
        "stores": {},
    }
    from importlib import metadata

    report["environment"]["versions"].update(
        {n: metadata.version(n) for n in ("fastapi", "uvicorn", "sqlalchemy", "psycopg", "httpx")}
    )
    import sqlite3

    report["environment"]["versions"]["sqlite"] = sqlite3.sqlite_version
    report["environment"]["versions"]["postgresql_server"] = pg_version()
    failed = False
    try:
        with tempfile.TemporaryDirectory(prefix="fedtune-load-") as tmp:
            for store in args.stores:
                failed |= not run_one(store, args, Path(tmp), report["stores"])
    finally:  # the JSON is written whatever happened, with what was measured
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.output}")
    return 1 if failed else 0


def run_one(store: str, args: argparse.Namespace, workdir: Path, out: dict) -> bool:
    """Measure ``store`` into ``out[store]``; False (with the reason recorded) when it failed."""
    try:
        with contextlib.ExitStack() as stack:
            if store == "sqlite":
                url = f"sqlite:///{workdir / 'fedtune.db'}"
            else:
                try:
                    url = stack.enter_context(pg_schema())
                except Exception as exc:  # unreachable server: a skip, said in the report
                    reason = f"skipped: {type(exc).__name__}: {exc}".splitlines()[0]
                    print(f"postgresql {reason}")
                    out[store] = {"skipped": reason}
                    return True
            out[store] = run_store(store, url, args, workdir)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        print(f"{store} FAILED: {reason}", file=sys.stderr)
        out[store] = {"failed": reason}
        return False
    errors = sum(v.get("errors", 0) for v in out[store].values() if isinstance(v, dict))
    return errors == 0


if __name__ == "__main__":
    sys.exit(main())
