"""What a hostile package's ``local`` driver and trials reach on the network: the API and MLflow.

A real ``fedtune serve`` (backend ``local``, code upload on, MLflow workspaces on a real
``fedtune mlflow-server``) runs a study whose package, at import in the driver and in every
trial's task builder, tries the machine's other services: PostgreSQL and Redis on the loopback
(their TCP ports, PostgreSQL's Unix socket, Redis on ``::1``), a port this test opens on the
loopback and on each other address of the box, and an abstract Unix socket of this test's. It
writes what it found into its study's folder (the one place it may write that the test can
read) and goes on: the study must succeed, unpacked and packed, with its trials and MLflow runs
recorded, while the API and MLflow answered it. Before :mod:`fedtune.sandbox_net`, every one of
those connections succeeded (the sandbox had the machine's network).

A service whose sandbox cannot have a network of its own (bubblewrap made to skip
``--unshare-net``, or unable to bring a loopback up, as in a container without the capability)
refuses to start with code upload on, in one line.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fedtune.code_package import pack
from fedtune.sandbox import sandbox_missing
from tests.integration.conftest import stop_group
from tests.integration.test_mlflow_tenancy import ADMIN_PASSWORD, start_server
from tests.needs import need
from tests.ports import free_port
from tests.service.code_fixtures import write_package
from tests.service.helpers import REPO, Server, tiny_spec

pytestmark = pytest.mark.integration

TOKEN = "sandbox-net-admin-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
POSTGRES_SOCKET = "/var/run/postgresql/.s.PGSQL.5432"

#: run at import in the driver and in each call of the task builder: try every target, then
#: the API and MLflow, and write the findings into the study's folder
PROBE = r"""
import glob, inspect, json, os, socket, urllib.error, urllib.request, uuid

FAMILIES = {{"inet": socket.AF_INET, "inet6": socket.AF_INET6, "unix": socket.AF_UNIX}}


def attempt(family, address):
    sock = socket.socket(FAMILIES[family], socket.SOCK_STREAM)
    sock.settimeout(3)
    try:
        sock.connect(address if family == "unix" else tuple(address))
        return "connected"
    except OSError as exc:
        return f"{{type(exc).__name__}}: {{exc.strerror or exc}}"
    finally:
        sock.close()


def status(url):
    try:
        return urllib.request.urlopen(url, timeout=20).status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return f"{{type(exc).__name__}}: {{exc}}"


found = {{
    "where": WHERE,
    "tried": {{label: attempt(family, address) for label, family, address in {targets!r}}},
    "api": status({api!r} + "/healthz"),
    "mlflow": status({mlflow!r} + "/health"),
    # the task built for a pack of configurations (fedtune.trainers.packed), or for one
    "packed": any(f.filename.endswith(os.path.join("trainers", "packed.py")) for f in inspect.stack()),
}}
workdir = os.environ.get("FEDTUNE_WORKDIR", "/nonexistent")
for folder in glob.glob(os.path.join(workdir, "studies", "*")):
    with open(os.path.join(folder, f"netprobe-{{WHERE}}-{{uuid.uuid4().hex}}.json"), "w") as out:
        json.dump(found, out)
"""

PACKAGE = """
import os
from fedtune.trainers.tasks import build_task, register_task

PROBE = {probe!r}


def probe(where):
    exec(PROBE, {{"WHERE": where}})


if os.environ.get("FEDTUNE_DRIVER_URL"):
    probe("driver")


@register_task("user_quadratic", "the quadratic, after a look around the network")
def build(params, seed):
    probe("trial")
    return build_task("quadratic", params, seed)
"""


def _box_addresses() -> list[str]:
    """The IPv4 addresses of this machine's interfaces other than the loopback."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _index, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            with contextlib.suppress(OSError):  # an interface without an IPv4 address
                answer = fcntl.ioctl(sock.fileno(), 0x8915, request)  # SIOCGIFADDR
                address = socket.inet_ntoa(answer[20:24])
                if not address.startswith("127."):
                    found.append(address)
    return found


class Listeners:
    """TCP servers of this test's on the loopback and the box's other addresses, and an
    abstract Unix socket: each counts the connections it accepts."""

    def __init__(self) -> None:
        self.accepted: dict[str, int] = {}
        self.targets: list[tuple[str, str, object]] = []
        self._sockets: list[socket.socket] = []
        self._done = threading.Event()
        for address in ["127.0.0.1", *_box_addresses()]:
            server = socket.create_server((address, 0))
            self._add(f"test-{address}", server, "inet", [address, server.getsockname()[1]])
        abstract = f"\0fedtune-sandbox-net-{uuid.uuid4().hex}"
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(abstract)
        server.listen()
        self._add("test-abstract-unix", server, "unix", abstract)

    def _add(self, label: str, server: socket.socket, family: str, address: object) -> None:
        server.settimeout(0.2)
        self.accepted[label] = 0
        self.targets.append((label, family, address))
        self._sockets.append(server)
        threading.Thread(target=self._accept, args=(label, server), daemon=True).start()

    def _accept(self, label: str, server: socket.socket) -> None:
        while not self._done.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                conn, _ = server.accept()
                self.accepted[label] += 1
                conn.close()

    def close(self) -> None:
        self._done.set()
        for server in self._sockets:
            server.close()


def _connects(family: str, address: object) -> bool:
    """Whether this process (on the host's network) connects to ``address``."""
    families = {"inet": socket.AF_INET, "inet6": socket.AF_INET6, "unix": socket.AF_UNIX}
    with socket.socket(families[family], socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        try:
            sock.connect(address if family == "unix" else tuple(address))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    """A real MLflow server, the test's listeners and a ``local`` service with code upload."""
    need("bwrap", sandbox_missing())
    root = tmp_path_factory.mktemp("sandbox-net")
    (root / "mlflow").mkdir()
    mlflow, mlflow_url = start_server(root / "mlflow")
    listeners = Listeners()
    server = None
    try:
        env = {
            "FEDTUNE_API_TOKEN": TOKEN,
            "FEDTUNE_DATABASE_URL": f"sqlite:///{root / 'fedtune.db'}",
            "FEDTUNE_WORKDIR": str(root / "work"),
            "FEDTUNE_BACKEND": "local",
            "FEDTUNE_ALLOW_CODE_UPLOAD": "true",
            "FEDTUNE_SCHEDULER_INTERVAL_S": "0.2",
            "FEDTUNE_HEARTBEAT_S": "1",
            "MLFLOW_TRACKING_URI": mlflow_url,
            "FEDTUNE_MLFLOW_WORKSPACES": "true",
            "FEDTUNE_MLFLOW_ADMIN_PASSWORD": ADMIN_PASSWORD,
            "MLFLOW_TRACKING_USERNAME": "admin",
            "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD,
        }
        server = Server(env, root / "serve.log").start(timeout=120)
        made = httpx.post(
            f"{server.url}/v1/projects", json={"name": "lab"}, headers=ADMIN, timeout=60
        )
        assert made.status_code == 201, made.text
        yield {"server": server, "mlflow": mlflow_url, "listeners": listeners, "root": root}
    finally:
        if server is not None:
            server.stop()
        listeners.close()
        stop_group(mlflow)


def _targets(listeners: Listeners) -> list[tuple[str, str, object]]:
    """Every target the probe tries: the machine's services and the test's listeners."""
    return [
        ("postgres-tcp", "inet", ["127.0.0.1", 5432]),
        ("postgres-unix", "unix", POSTGRES_SOCKET),
        ("redis-tcp", "inet", ["127.0.0.1", 6379]),
        ("redis-tcp6", "inet6", ["::1", 6379, 0, 0]),
        *listeners.targets,
    ]


def _wait(server: Server, sid: str, timeout_s: float = 400) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        study = httpx.get(f"{server.url}/v1/studies/{sid}", headers=ADMIN, timeout=30).json()
        if study["state"] in ("failed", "succeeded", "cancelled"):
            return study
        time.sleep(1)
    raise AssertionError(f"study {sid} still {study['state']}:\n{server.log.read_text()[-3000:]}")


@pytest.mark.parametrize(
    ("trials", "concurrent", "pack_size"),
    # the fewest trials that show each: one trial process with one configuration, one with a
    # pack of two
    [pytest.param(1, 1, 1, id="unpacked"), pytest.param(2, 2, 2, id="packed")],
)
def test_a_local_driver_and_its_trials_reach_the_api_and_mlflow_and_nothing_else(
    world, tmp_path, trials: int, concurrent: int, pack_size: int
) -> None:
    server, listeners = world["server"], world["listeners"]
    targets = _targets(listeners)
    # from the host, the test's own listeners answer (and so may PostgreSQL and Redis)
    before = dict(listeners.accepted)
    reachable = {label for label, family, address in targets if _connects(family, address)}
    assert {label for label, _, _ in listeners.targets} <= reachable
    deadline = time.monotonic() + 10  # each accepted this test's connection
    while any(listeners.accepted[k] == before[k] for k in before) and time.monotonic() < deadline:
        time.sleep(0.1)
    accepted_before = dict(listeners.accepted)
    assert all(accepted_before[k] == before[k] + 1 for k in before), (before, accepted_before)

    probe = PROBE.format(targets=targets, api=server.url, mlflow=world["mlflow"])
    package = pack(write_package(tmp_path / "lab", PACKAGE.format(probe=probe)))
    up = httpx.post(
        f"{server.url}/v1/code",
        content=package.data,
        headers={**ADMIN, "Content-Type": "application/zip"},
        params={"project": "lab"},
        timeout=60,
    )
    assert up.status_code in (200, 201), up.text
    spec = tiny_spec(
        name=f"net-{pack_size}",
        trials=trials,
        rounds=3,
        project="lab",
        task={"name": "user_quadratic", "clients": 6, "dim": 3},
        code={"sha256": package.sha256, "modules": ["user_lab.tasks"]},
        resources={"cpu": 1, "pack": pack_size},
    )
    spec["budget"]["max_concurrent"] = concurrent
    r = httpx.post(f"{server.url}/v1/studies", json=spec, headers=ADMIN, timeout=120)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    study = _wait(server, sid)
    assert study["state"] == "succeeded", (study, server.log.read_text()[-3000:])

    folder = Path(world["root"]) / "work" / "studies" / sid
    reports = [json.loads(p.read_text()) for p in sorted(folder.glob("netprobe-*.json"))]
    wheres = [report["where"] for report in reports]
    assert "driver" in wheres and "trial" in wheres, wheres  # it ran in both, and reported
    assert any(report["packed"] for report in reports) == (pack_size > 1), reports
    for report in reports:
        connected = {k: v for k, v in report["tried"].items() if v == "connected"}
        assert connected == {}, (report["where"], connected)
        assert set(report["tried"]) == {label for label, _, _ in targets}
        assert report["api"] == 200 and report["mlflow"] == 200, report
    assert listeners.accepted == accepted_before  # none of the test's listeners saw it

    # the study's records: every trial completed, through the API, and its run in MLflow
    listed = httpx.get(f"{server.url}/v1/studies/{sid}/trials", headers=ADMIN, timeout=30)
    rows = listed.json()
    assert len(rows) == trials, rows
    assert {row["state"] for row in rows} == {"completed"}, rows
    assert all(row["value"] is not None and row["mlflow_run_id"] for row in rows), rows
    parent = study["mlflow"]["run_id"]
    with httpx.Client(
        base_url=world["mlflow"],
        auth=("admin", ADMIN_PASSWORD),
        headers={"X-MLFLOW-WORKSPACE": "lab"},
        timeout=30,
    ) as admin:
        for row in rows:
            run = admin.get("/api/2.0/mlflow/runs/get", params={"run_id": row["mlflow_run_id"]})
            assert run.status_code == 200, run.text
            data = run.json()["run"]
            assert data["info"]["status"] == "FINISHED", data["info"]
            assert data["data"].get("metrics"), data
            tags = {tag["key"]: tag["value"] for tag in data["data"].get("tags", [])}
            assert tags.get("mlflow.parentRunId") == parent, tags


BWRAP_WITHOUT_NETNS = """#!/bin/sh
# bubblewrap made to skip its network namespace: the sandbox would have the host's network
for arg do
  shift
  [ "$arg" = "--unshare-net" ] && continue
  set -- "$@" "$arg"
done
exec {bwrap} "$@"
"""

BWRAP_WITHOUT_LOOPBACK = """#!/bin/sh
# bubblewrap where a network namespace's loopback cannot be set up (a container without the
# capability answers this way)
for arg do
  if [ "$arg" = "--unshare-net" ]; then
    echo "bwrap: loopback: Failed RTM_NEWADDR: Operation not permitted" >&2
    exit 1
  fi
done
exec {bwrap} "$@"
"""


@pytest.mark.parametrize(
    ("shim", "says"),
    [
        pytest.param(BWRAP_WITHOUT_NETNS, "its network is not its own", id="no-netns"),
        pytest.param(BWRAP_WITHOUT_LOOPBACK, "Failed RTM_NEWADDR", id="no-loopback"),
    ],
)
def test_the_service_refuses_code_upload_without_a_network_of_the_sandboxs_own(
    tmp_path, shim: str, says: str
) -> None:
    need("bwrap", sandbox_missing())
    real = subprocess.run(["sh", "-c", "command -v bwrap"], capture_output=True, text=True)
    bins = tmp_path / "bin"
    bins.mkdir()
    (bins / "bwrap").write_text(shim.format(bwrap=real.stdout.strip()))
    (bins / "bwrap").chmod(stat.S_IRWXU)
    env = {
        **os.environ,
        "PATH": f"{bins}:{os.environ['PATH']}",
        "FEDTUNE_DATABASE_URL": f"sqlite:///{tmp_path / 'fedtune.db'}",
        "FEDTUNE_WORKDIR": str(tmp_path / "work"),
        "FEDTUNE_BACKEND": "local",
        "FEDTUNE_ALLOW_CODE_UPLOAD": "true",
        "FEDTUNE_API_TOKEN": TOKEN,
    }
    env.pop("FEDTUNE_CODE_SANDBOX", None)
    argv = [sys.executable, "-m", "fedtune.cli", "serve", "--port", str(free_port())]
    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "FEDTUNE_CODE_SANDBOX" in refused.stderr and says in refused.stderr, refused.stderr
    assert "FEDTUNE_CODE_SANDBOX=none" in refused.stderr  # and the way out
    assert TOKEN not in refused.stderr + refused.stdout
