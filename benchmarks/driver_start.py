"""A study driver's start against the service, before and after the one-time start tickets.

A driver that reports through the API used to start with its credential in its environment and
ask for its study at once (``GET /v1/driver/studies/<id>``); now it starts with a ticket and
first exchanges it (``POST …/ticket``), then asks. This measures what that adds, for both code
versions side by side (``--before``: a checkout of the commit before the tickets), interleaved
round by round, each round with a fresh ``fedtune serve`` (backend ``none``, SQLite, a bootstrap
token) per version:

* **requests** — in a client process of that version, ``--requests`` times: a study made
  running as attempt 1, its credential made as the version's scheduler makes it (the HMAC token
  before; a ticket issued into the database after), then timed: (after) the redemption, and
  the first ``GET`` of the study, and one heartbeat: what a driver sends before it starts Ray;
* **process** — ``--drivers`` times: the real ``fedtune worker run-study <id> --attempt 1`` of a
  queued study, launched with the version's environment (``FEDTUNE_DRIVER_URL`` and its token,
  or its ticket): its wall time from launch to exit, which is the interpreter, the imports, the
  (redemption and) claim, and its exit (a queued study is not its to run). This is the part of a
  study's start-up the tickets change; Ray's start and the trials come after it, unchanged.

Medians, 90th percentiles and the after − before differences go to the JSON
(``benchmarks/_env.write_report``).

    .venv/bin/python benchmarks/driver_start.py --before /tmp/base-wt \\
        --out benchmarks/results/driver_start.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._env import write_report
from tests.service.helpers import tiny_spec

REPO = Path(__file__).resolve().parents[1]
TOKEN = "driver-start-benchmark-token-0123456789"

#: run in a client process of one version: make studies, time a driver's first requests
CLIENT = r"""
import importlib.util, json, sys, time
import httpx
from fedtune.service.db import Database
from fedtune.service.repository import Repository
from fedtune.service.settings import load_settings
from fedtune.service.states import StudyState

url, db_url, workdir, n, drivers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
TOKEN = sys.argv[6]
settings = load_settings(database_url=db_url, workdir=workdir, api_token=TOKEN)
db = Database(db_url)
tickets = importlib.util.find_spec("fedtune.service.tickets") is not None
admin = {"Authorization": f"Bearer {TOKEN}"}
spec = json.loads(sys.argv[7])


def credential(sid):
    if tickets:
        from fedtune.service import tickets as t
        with db.session() as s:
            return t.issue(s, sid, 1, 600)
    from fedtune.service.code_url import code_url_key
    from fedtune.service.driver_link import driver_token
    return driver_token(code_url_key(settings), sid, 1)


out = {"tickets": tickets, "first_requests_s": [], "redeem_s": [], "claim_s": [], "heartbeat_s": []}
with httpx.Client(base_url=url, timeout=60) as client:
    ids = []
    for _ in range(n + drivers):
        answer = client.post("/v1/studies", json=spec, headers=admin)
        assert answer.status_code == 201, answer.text
        ids.append(answer.json()["id"])
    for sid in ids[:n]:
        with db.session() as s:
            Repository(s).transition(sid, StudyState.RUNNING, attempts=1)
    for sid in ids[:n]:
        secret = credential(sid)
        start = time.perf_counter()
        token = secret
        if tickets:
            r = client.post(f"/v1/driver/studies/{sid}/ticket", headers={"Authorization": f"Bearer {secret}"})
            assert r.status_code == 200, r.text
            token = r.json()["token"]
            out["redeem_s"].append(time.perf_counter() - start)
        bearer = {"Authorization": f"Bearer {token}"}
        t0 = time.perf_counter()
        assert client.get(f"/v1/driver/studies/{sid}", headers=bearer).status_code == 200
        out["claim_s"].append(time.perf_counter() - t0)
        out["first_requests_s"].append(time.perf_counter() - start)
        t0 = time.perf_counter()
        assert client.post(f"/v1/driver/studies/{sid}/heartbeat", headers=bearer).json() is True
        out["heartbeat_s"].append(time.perf_counter() - t0)
    out["queued"] = [[sid, credential(sid)] for sid in ids[n:]]
print(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serve(path: Path, root: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """``fedtune serve`` of the checkout ``path`` (backend none, SQLite under ``root``)."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(path),
        "FEDTUNE_DATABASE_URL": f"sqlite:///{root / 'fedtune.db'}",
        "FEDTUNE_WORKDIR": str(root / "work"),
        "FEDTUNE_BACKEND": "none",
        "FEDTUNE_API_TOKEN": TOKEN,
    }
    log = (root / "serve.log").open("wb")
    argv = [sys.executable, "-m", "fedtune.cli", "serve", "--port", str(port)]
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"fedtune serve exited {proc.returncode}: see {root}/serve.log")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"fedtune serve not ready: see {root}/serve.log")
        yield url, env
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def one_round(name: str, path: Path, args: argparse.Namespace) -> dict:
    """One fresh service of checkout ``path``: the client's timings and the drivers' walls."""
    with tempfile.TemporaryDirectory(prefix=f"driver-start-{name}-") as tmp:
        root = Path(tmp)
        with serve(path, root) as (url, env):
            client = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CLIENT,
                    url,
                    env["FEDTUNE_DATABASE_URL"],
                    env["FEDTUNE_WORKDIR"],
                    str(args.requests),
                    str(args.drivers),
                    TOKEN,
                    json.dumps(tiny_spec(name="driver-start", trials=1)),
                ],
                env=env,
                capture_output=True,
                text=True,
                cwd=root,  # not this checkout: ``python -c`` imports from its working directory
            )
            if client.returncode != 0:
                raise RuntimeError(f"the client of {name} failed: {client.stderr[-3000:]}")
            got = json.loads(client.stdout.strip().splitlines()[-1])
            walls = []
            for sid, secret in got.pop("queued"):
                name_var = "FEDTUNE_DRIVER_TICKET" if got["tickets"] else "FEDTUNE_DRIVER_TOKEN"
                driver_env = {
                    k: v for k, v in env.items() if k not in ("FEDTUNE_DATABASE_URL",)
                } | {"FEDTUNE_DRIVER_URL": url, name_var: secret}
                argv = [sys.executable, "-m", "fedtune.cli", "worker", "run-study", sid]
                start = time.perf_counter()
                done = subprocess.run(
                    [*argv, "--attempt", "1"], env=driver_env, capture_output=True, cwd=root
                )
                walls.append(time.perf_counter() - start)
                assert done.returncode == 0, done.stderr.decode()[-2000:]
            got["driver_process_s"] = walls
            return got


def summary(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 2),
        "n": len(ordered),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout before the tickets")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--drivers", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/driver_start.json")
    args = parser.parse_args()
    started = time.time()
    versions = {"before": args.before.resolve(), "after": REPO}
    samples: dict[str, dict[str, list[float]]] = {v: {} for v in versions}
    loads = []
    for _ in range(args.rounds):
        for name, path in versions.items():
            loads.append(os.getloadavg()[0])
            got = one_round(name, path, args)
            for key, value in got.items():
                if isinstance(value, list):
                    samples[name].setdefault(key, []).extend(value)
    medians = {v: {k: summary(s) for k, s in d.items()} for v, d in samples.items()}
    delta = {
        key: round(medians["after"][key]["median_ms"] - medians["before"][key]["median_ms"], 2)
        for key in ("first_requests_s", "claim_s", "heartbeat_s", "driver_process_s")
    }
    body = {
        "benchmark": "driver_start",
        "versions": {k: str(v) for k, v in versions.items()},
        "rounds": args.rounds,
        "load_average_1m": loads,
        "summary": medians,
        "after_minus_before_median_ms": delta,
        "samples_s": samples,
    }
    write_report(args.out, body, started, "benchmarks/driver_start.py", sys.argv[1:])
    print(json.dumps({"summary": medians, "after_minus_before_median_ms": delta}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
