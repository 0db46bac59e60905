"""The chart's long-running servers, run from the built image as rendered:
MLflow's ``mlflow server`` container and the shared RayCluster's head and worker, started the
way KubeRay starts them. Each is a container of tests/deploy/pod_sandbox.py (the image's root
file system, read-only, UID 10001, no capabilities, only the rendered volumes writable).

KubeRay's part, emulated (its operator does not run here): it writes no ``command`` into the
rendered containers; it starts Ray with ``/bin/bash -lc -- "ulimit -n 65536; ray start --head
--block <rayStartParams as --key=value>"`` on the head and ``... ray start --address=<head
Service>:6379 --block <rayStartParams>`` on workers. The test runs exactly that, with two
translations because the sandbox shares this machine's network: every port Ray opens is a free
port of this machine (``--port``, ``--dashboard-port``, the node manager's and object manager's,
``--ray-client-server-port``), and the head Service resolves to 127.0.0.1. MLflow's
``--port=5000`` is a free port too; its ``MLFLOW_BACKEND_STORE_URI`` a throw-away PostgreSQL
schema.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy.conftest import RELEASE, one
from tests.deploy.test_pod_commands_run import container_env, pod_process
from tests.needs import need
from tests.ports import free_block, free_port, free_ports
from tests.service.helpers import pg_schema, pg_unreachable_reason

pytestmark = [pytest.mark.integration, pytest.mark.image]

FULLNAME = f"{RELEASE}-fedtune"
RAY_VALUES = {"backend": "ray", "rayCluster": {"enabled": True}}


def _wait(url: str, process: subprocess.Popen, ok, deadline_s: float) -> Any:
    """Poll ``url`` until ``ok(response)`` holds; None if the process exits or time runs out.
    One client for all the polls (a new one costs ~25 ms of CPU a poll)."""
    end = time.monotonic() + deadline_s
    with httpx.Client(timeout=5) as http:
        while time.monotonic() < end and process.poll() is None:
            try:
                response = http.get(url)
                if ok(response):
                    return response
            except httpx.HTTPError:
                pass
            time.sleep(1)
    return None


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)


def test_the_mlflow_server_container_serves_from_the_image(render, tmp_path, image_root) -> None:
    need("postgres", pg_unreachable_reason())
    manifests = render({})
    pod = one(manifests, "Deployment", f"{FULLNAME}-mlflow")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    port = free_port()
    assert "--port=5000" in container["args"]
    served = {
        **container,
        "args": [a if a != "--port=5000" else f"--port={port}" for a in container["args"]],
    }
    with pg_schema() as url:
        env = container_env(container, manifests) | {"MLFLOW_BACKEND_STORE_URI": url}
        sandbox, full_env, cwd = pod_process(tmp_path, pod, served, env, image_root)
        log = tmp_path / "mlflow.log"
        process = sandbox.popen(
            [*served["command"], *served["args"]], env=full_env, cwd=cwd, log=log
        )
        try:
            base = f"http://127.0.0.1:{port}"
            ok = _wait(f"{base}/health", process, lambda r: r.status_code == 200, 300)
            assert ok is not None, log.read_text()[-3000:]
            # the chart's default: one workspace per project behind MLflow's login (the API is
            # never open), the admin made at the first start from the rendered Secret
            secret = one(manifests, "Secret", f"{FULLNAME}-mlflow-auth")["stringData"]
            create = {"url": f"{base}/api/2.0/mlflow/experiments/create", "timeout": 30}
            create["json"] = {"name": "from-the-image"}
            create["headers"] = {"X-MLFLOW-WORKSPACE": "default"}
            assert httpx.post(**create).status_code == 401  # no login, nothing
            created = httpx.post(**create, auth=("admin", secret["admin-password"]))
            assert created.status_code == 200, created.text
            # the chart turns MLflow's server jobs off: no huey job consumers beside the server
            huey = [cmd for cmd in _descendants(process.pid) if "huey" in cmd]
            assert not huey, huey
        finally:
            _stop(process)
    assert process.returncode is not None


def _descendants(pid: int) -> list[str]:
    """The command lines of every process below ``pid`` (from /proc)."""
    parent: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    below, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, ppid in parent.items() if ppid in frontier} - below
        below |= frontier
    out = []
    for child in below:
        try:
            out.append((Path("/proc") / str(child) / "cmdline").read_bytes().replace(b"\0", b" "))
        except OSError:
            continue
    return [c.decode(errors="replace") for c in out]


def _kuberay_start(params: dict[str, str], *, head: bool, ports: dict[str, Any]) -> list[str]:
    """The command KubeRay gives a Ray container (see the module docstring), ports translated:
    ``ports`` holds the head's, the node's worker ports (``workers``, a range) and every port
    the test chose (``taken``), which the node manager's and object manager's must avoid."""
    flags = [f"--{key}={value}" for key, value in params.items()]
    if head:
        flags += [
            f"--port={ports['gcs']}",
            f"--dashboard-port={ports['dashboard']}",
            f"--ray-client-server-port={ports['client']}",
        ]
        start = ["ray", "start", "--head", "--block", *flags]
    else:
        start = ["ray", "start", f"--address=127.0.0.1:{ports['gcs']}", "--block", *flags]
    workers: range = ports["workers"]
    node_manager, object_manager = free_ports(2, exclude=ports["taken"])
    start += [
        f"--node-manager-port={node_manager}",
        f"--object-manager-port={object_manager}",
        f"--min-worker-port={workers.start}",
        f"--max-worker-port={workers.stop - 1}",
    ]
    return ["/bin/bash", "-lc", "--", "ulimit -n 65536 2>/dev/null || true; " + " ".join(start)]


def test_the_raycluster_head_and_worker_start_from_the_image(render, tmp_path, image_root) -> None:
    manifests = render(RAY_VALUES)
    cluster = one(manifests, "RayCluster")["spec"]
    head_pod = cluster["headGroupSpec"]["template"]["spec"]
    group = cluster["workerGroupSpecs"][0]
    worker_pod = group["template"]["spec"]
    ports: dict[str, Any] = dict(zip(("gcs", "dashboard", "client"), free_ports(3), strict=True))
    # each node's worker ports: a free block of 41, which no other port of the test lands in
    # (fixed blocks at 20000 and 21000 once met a node manager's port drawn from the same range)
    blocks = [free_block(41, exclude=ports.values())]
    blocks.append(free_block(41, exclude=[*ports.values(), *blocks[0]]))
    taken = [*ports.values(), *blocks[0], *blocks[1]]
    processes: list[subprocess.Popen] = []
    try:
        for name, pod, params, head, base in (
            ("head", head_pod, cluster["headGroupSpec"]["rayStartParams"], True, blocks[0]),
            (
                "worker",
                worker_pod,
                {"num-cpus": "1", **group.get("rayStartParams", {})},
                False,
                blocks[1],
            ),
        ):
            container = pod["containers"][0]
            assert "command" not in container  # KubeRay writes it (emulated here)
            env = container_env(container, manifests)
            sandbox, full_env, cwd = pod_process(tmp_path / name, pod, container, env, image_root)
            argv = _kuberay_start(
                params, head=head, ports=ports | {"workers": base, "taken": taken}
            )
            processes.append(
                sandbox.popen(argv, env=full_env, cwd=cwd, log=tmp_path / f"{name}.log")
            )
            if head:
                url = f"http://127.0.0.1:{ports['dashboard']}/api/version"
                up = _wait(url, processes[0], lambda r: r.status_code == 200, 300)
                assert up is not None, (tmp_path / "head.log").read_text()[-3000:]
        url = f"http://127.0.0.1:{ports['dashboard']}/nodes?view=summary"

        def two_alive(response: httpx.Response) -> bool:
            nodes = response.json().get("data", {}).get("summary", [])
            return sum(n.get("raylet", {}).get("state") == "ALIVE" for n in nodes) == 2

        joined = _wait(url, processes[-1], two_alive, 300)
        logs = "\n".join((tmp_path / f"{n}.log").read_text()[-1500:] for n in ("head", "worker"))
        assert joined is not None, logs
        nodes = joined.json()["data"]["summary"]
        assert sorted(n["raylet"]["isHeadNode"] for n in nodes) == [False, True]
    finally:
        for process in reversed(processes):
            _stop(process)


def test_the_ray_head_writes_only_its_volumes(image_root, tmp_path: Path) -> None:
    """The root really is read-only for the pod: Ray's session dir must go to the /tmp volume."""
    from tests.deploy.pod_sandbox import Sandbox

    pod = Sandbox(tmp_path / "pod", image_root)
    done = pod.run(
        ["/bin/sh", "-c", "touch /opt/venv/x || touch /etc/x || echo refused"],
        env=pod.env({}),
        cwd="/",
    )
    assert "Read-only file system" in done.stderr and done.stdout.strip() == "refused"
