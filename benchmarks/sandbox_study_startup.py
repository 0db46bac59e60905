"""A sandboxed study's start-up under ``fedtune serve``, for two code trees, interleaved.

What a member with code upload waits for on the ``local`` backend: the service's start (its
sandbox probes, the network's included where the tree has one), then a study of uploaded code
(the test suite's good package: a task registered by user code, the quadratic underneath; 2
trials of 3 rounds, one at a time) from its submission to its first trial recorded and to its
end, its driver, Ray and trials in the sandbox, logging to a real MLflow tracking server
(``fedtune mlflow-server``, workspaces on), which both trees share. Each repeat starts a fresh
service per tree, the trees alternating and each first every other repeat, so that a busy
machine weighs on both alike.

    python benchmarks/sandbox_study_startup.py --tree before=../main --tree after=. \\
        --repeats 5 --out benchmarks/results/sandbox_study_startup.json

Per tree and phase the seconds of every repeat and their median: ``serve_ready_s`` (launch to
``/readyz`` answering 200), ``first_trial_s`` (submission to the first trial listed by the API),
``study_s`` (submission to ``succeeded``).

A study's start-up on a busy machine varies by tens of seconds, far more than the routes can
add; so the routes' own costs are also timed apart, in this checkout, ``--relay-repeats``
times, interleaved (``relay``): a sandbox's start (``python -c pass``) with and without routes,
and 100 HTTP requests, each on a new connection, from a sandbox to a server of this process's
over a route and over the host's network (a sandbox with ``network=True``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._env import write_report
from fedtune.code_package import pack
from fedtune.sandbox import Sandbox
from fedtune.sandbox_net import SandboxNet
from tests.integration.conftest import stop_group
from tests.integration.test_mlflow_tenancy import ADMIN_PASSWORD, start_server
from tests.ports import free_port
from tests.service.code_fixtures import write_package
from tests.service.helpers import tiny_spec

TOKEN = "benchmark-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
PHASES = ("serve_ready_s", "first_trial_s", "study_s")


def _serve(tree: Path, root: Path, mlflow: str) -> tuple[subprocess.Popen, str, float]:
    """``fedtune serve`` of ``tree`` (local backend, code upload on); (process, URL, seconds
    to ready)."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "FEDTUNE_API_TOKEN": TOKEN,
        "FEDTUNE_DATABASE_URL": f"sqlite:///{root / 'fedtune.db'}",
        "FEDTUNE_WORKDIR": str(root / "work"),
        "FEDTUNE_BACKEND": "local",
        "FEDTUNE_ALLOW_CODE_UPLOAD": "true",
        "FEDTUNE_SCHEDULER_INTERVAL_S": "0.2",
        "FEDTUNE_HEARTBEAT_S": "1",
        "MLFLOW_TRACKING_URI": mlflow,
        "FEDTUNE_MLFLOW_WORKSPACES": "true",
        "FEDTUNE_MLFLOW_ADMIN_PASSWORD": ADMIN_PASSWORD,
        "MLFLOW_TRACKING_USERNAME": "admin",
        "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD,
    }
    env.pop("FEDTUNE_CODE_SANDBOX", None)
    argv = [sys.executable, "-m", "fedtune.cli", "serve", "--port", str(port)]
    started = time.perf_counter()
    with (root / "serve.log").open("ab") as log:
        proc = subprocess.Popen(
            argv, env=env, cwd=tree, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    while proc.poll() is None:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return proc, url, time.perf_counter() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{tree}: serve exited {proc.returncode}: see {root / 'serve.log'}")


def _study(url: str, package_dir: Path) -> tuple[float, float]:
    """Upload the package, submit its study, wait: (seconds to the first trial, to the end)."""
    package = pack(package_dir)
    up = httpx.post(
        f"{url}/v1/code",
        content=package.data,
        headers={**ADMIN, "Content-Type": "application/zip"},
        timeout=60,
    )
    up.raise_for_status()
    spec = tiny_spec(name="bench", trials=2, rounds=3)
    spec["task"] = {**spec["task"], "name": "user_quadratic"}
    spec["code"] = {"sha256": package.sha256, "modules": ["user_lab.tasks"]}
    started = time.perf_counter()
    made = httpx.post(f"{url}/v1/studies", json=spec, headers=ADMIN, timeout=120)
    made.raise_for_status()
    sid = made.json()["id"]
    first = None
    while True:
        if first is None:
            trials = httpx.get(f"{url}/v1/studies/{sid}/trials", headers=ADMIN, timeout=30)
            if trials.status_code == 200 and trials.json():
                first = time.perf_counter() - started
        state = httpx.get(f"{url}/v1/studies/{sid}", headers=ADMIN, timeout=30).json()
        if state["state"] in ("succeeded", "failed", "cancelled"):
            if state["state"] != "succeeded":
                raise RuntimeError(f"study {sid} {state['state']}: {state.get('error')}")
            return first or time.perf_counter() - started, time.perf_counter() - started
        time.sleep(0.1)


#: run in the sandbox: 100 GETs of the server at argv[1] (host, port), a new connection each,
#: then 100 on one kept-alive connection (as MLflow's and the driver's HTTP clients do); the
#: seconds of each hundred
REQUESTS = """
import http.client, sys, time
host, port = sys.argv[1], int(sys.argv[2])
start = time.perf_counter()
for _ in range(100):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/", headers={"Connection": "close"})
    assert conn.getresponse().read() == b"ok"
    conn.close()
middle = time.perf_counter()
conn = http.client.HTTPConnection(host, port, timeout=30)
for _ in range(100):
    conn.request("GET", "/")
    assert conn.getresponse().read() == b"ok"
print(middle - start, time.perf_counter() - middle)
"""


class _Ok(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keeps a connection open unless told to close it

    def setup(self) -> None:
        super().setup()  # headers and body are two writes: no Nagle delay between them
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *_args: object) -> None:
        pass


def _relay_costs(repeats: int) -> dict:
    """Seconds of a sandbox's start, and of 100 requests from it (new connections, one kept
    connection), with routes and without."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}"
    env = {"PATH": "/usr/bin:/bin"}
    kinds = ("start", "http_new", "http_kept")
    out: dict[str, list[float]] = {f"{k}{r}": [] for k in kinds for r in ("", "_routed")}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for _ in range(repeats):
                for routed, kind in itertools.product((False, True), ("start", "http")):
                    # today's local driver: the host's network; with routes: the API's only
                    net = SandboxNet.create(Path(tmp), [url]) if routed else None
                    box = Sandbox(env=env, net=net, network=not routed)
                    key = f"{kind}_routed" if routed else kind
                    if kind == "start":
                        started = time.perf_counter()
                        box.run([sys.executable, "-I", "-c", "pass"], timeout_s=60)
                        out[key].append(time.perf_counter() - started)
                    else:
                        argv = [sys.executable, "-I", "-c", REQUESTS, "127.0.0.1", str(port)]
                        new, kept = map(float, box.run(argv, timeout_s=120).stdout.split())
                        out[key.replace("http", "http_new")].append(new)
                        out[key.replace("http", "http_kept")].append(kept)
    finally:
        server.shutdown()
    medians = {k: statistics.median(v) for k, v in out.items()}
    return {
        "seconds": {k: [round(x, 4) for x in v] for k, v in out.items()},
        "median_s": medians,
        "added_start_s": medians["start_routed"] - medians["start"],
        "added_per_request_ms": {
            k: (medians[f"{k}_routed"] - medians[k]) * 10 for k in ("http_new", "http_kept")
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH of a checkout")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--relay-repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    trees = {name: Path(path).resolve() for name, _, path in (t.partition("=") for t in args.tree)}
    wall = time.time()
    seconds: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PHASES} for n in trees}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "mlflow").mkdir()
        mlflow, mlflow_url = start_server(Path(tmp) / "mlflow")
        package_dir = write_package(Path(tmp) / "lab")
        try:
            for repeat in range(args.repeats):
                order = list(trees.items())  # each tree first every other repeat
                for name, tree in order if repeat % 2 == 0 else order[::-1]:
                    root = Path(tmp) / f"{name}-{repeat}"
                    root.mkdir()
                    proc, url, ready = _serve(tree, root, mlflow_url)
                    try:
                        first, whole = _study(url, package_dir)
                    finally:
                        stop_group(proc)
                    for phase, value in zip(PHASES, (ready, first, whole), strict=True):
                        seconds[name][phase].append(round(value, 3))
                    print(name, repeat, seconds[name]["study_s"][-1], flush=True)
        finally:
            stop_group(mlflow)
    medians = {n: {p: statistics.median(v) for p, v in d.items()} for n, d in seconds.items()}
    relay = _relay_costs(args.relay_repeats)
    body = {
        "benchmark": "sandbox_study_startup",
        "trees": {n: str(t) for n, t in trees.items()},
        "trees_commits": {n: _commit(t) for n, t in trees.items()},
        "repeats": args.repeats,
        "seconds": seconds,
        "median_s": medians,
        "relay": relay,
    }
    print(medians, relay["median_s"])
    if args.out:
        write_report(args.out, body, wall, "benchmarks/sandbox_study_startup.py", sys.argv[1:])
    return 0


def _commit(tree: Path) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
