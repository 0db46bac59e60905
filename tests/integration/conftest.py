"""Fixtures of the tuning integration tests: a real ``mlflow server``, one local Ray, small specs.

* ``mlflow_server`` — ``mlflow server`` on a free port with a SQLite backend and an artifact
  folder in tmp (in one process: ``tests/mlflow_plain.py``), started in its own process group
  and stopped by that group's id at teardown;
* ``ray_local`` — one in-process Ray for the whole session (run_study uses a Ray that is already
  running and leaves it up, so the in-process studies share one start-up), started with one
  retry and lean (``tests/ray_start.py``: no log or autoscaler monitor, dashboard agents
  sampling every 60 s; its drivers take no worker logs and nothing autoscales);
  ``ray.shutdown()`` always runs at teardown. Tests that go
  through the CLI start their own embedded Ray;
* ``quadratic_study`` — a tiny quadratic study spec (dict) to adapt per test.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port
from tests.procs import wait_gone

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]


def wait_http(url: str, proc: subprocess.Popen, timeout: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text()[-2000:] if log else ""
            raise RuntimeError(f"server exited with {proc.returncode}:\n{text}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"{url} not up after {timeout} s")


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """Stop a process started with ``start_new_session=True`` and its children (by pgid)."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def descendants(pid: int) -> list[int]:
    """PIDs of every descendant of ``pid`` (from /proc), children first."""
    out: list[int] = []
    stack = [pid]
    while stack:
        parent = stack.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError):
                for child in (task / "children").read_text().split():
                    out.append(int(child))
                    stack.append(int(child))
    return out


def kill_pids(pids: list[int], timeout: float = 15.0) -> None:
    """Wait for ``pids`` to exit on their own, then SIGKILL the ones still alive (by id)."""
    for p in wait_gone(pids, timeout):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


@contextlib.contextmanager
def mlflow_server_process(
    backend_uri: str,
    log: Path,
    *,
    workers: int = 1,
    artifacts: str | None = None,
    timeout: float = 180.0,
    cwd: Path | None = None,
) -> Iterator[tuple[subprocess.Popen, str]]:
    """A real ``mlflow server`` on ``backend_uri`` at a free port of 127.0.0.1, in a session of
    its own, without GenAI job workers (``artifacts``: where it stores the artifacts it
    serves): the process and its base URL once ``/health`` answers; its group is stopped on
    exit. The tests' session server, the load and MLflow-UI benchmarks all start it so, as
    one process that does what MLflow's command and its uvicorn worker do
    (:mod:`tests.mlflow_plain`: one import of MLflow's server instead of two)."""
    port = free_port()
    # MLflow's command and the uvicorn worker it starts, in one process (tests/mlflow_plain.py)
    cmd = [
        sys.executable,
        "-P",  # the working directory is not put on sys.path: the repository's is, below
        "-m",
        "tests.mlflow_plain",
        "--backend-store-uri",
        backend_uri,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    if artifacts is not None:
        cmd += ["--serve-artifacts", "--artifacts-destination", artifacts]
    env = {
        **os.environ,
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no GenAI job workers
        "PYTHONPATH": os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH")))),
    }
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", proc, timeout=timeout, log=log)
        yield proc, url
    finally:
        stop_group(proc)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("mlflow-server")
    with mlflow_server_process(
        f"sqlite:///{root / 'mlflow.db'}", root / "server.log", artifacts=str(root / "artifacts")
    ) as (_, url):
        yield url


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    import logging

    import ray

    from tests.ray_start import init_ray

    temp = tempfile.mkdtemp(prefix="ft-ray-", dir="/tmp")  # short: unix socket paths
    try:
        init_ray(
            temp,
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=256 * 1024**2,
            logging_level=logging.ERROR,
            log_to_driver=False,
        )
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


_QUADRATIC_STUDY: dict[str, Any] = {
    "name": "quad",
    "task": {"name": "quadratic", "clients": 10, "dim": 5, "seed": 0},
    "algorithm": "fedavg",
    "train": {
        "rounds": 12,
        "clients_per_round": 5,
        "local_steps": 3,
        "batch_size": 4,
        "eval_every": 4,
        "dtype": "float64",
    },
    "search": {
        "space": "fedavg",
        "override": {
            "client_lr": {"low": 0.01, "high": 0.1},
            "server_lr": {"low": 0.05, "high": 0.2},
        },
    },
    "objective": {"metric": "train_loss", "last_rounds": 3},
    "sampler": {"name": "tpe", "seed": 0},
    "scheduler": {"name": "asha", "grace_rounds": 4, "reduction_factor": 2},
    "budget": {"trials": 5, "max_concurrent": 2},
}


def make_quadratic_study(name: str, **overrides: Any) -> dict[str, Any]:
    """A tiny quadratic study spec (dict) with top-level ``overrides``."""
    spec = copy.deepcopy(_QUADRATIC_STUDY)
    spec["name"] = name
    spec.update(copy.deepcopy(overrides))
    return spec


@pytest.fixture
def quadratic_study():
    """``quadratic_study(name, **top_level_overrides)`` -> a study spec dict."""
    return make_quadratic_study


@pytest.fixture(scope="session")
def proc_tools():
    """Helpers for tests that start and kill processes (module functions, as a namespace)."""
    import types

    return types.SimpleNamespace(bin=BIN, descendants=descendants, kill_pids=kill_pids)


@pytest.fixture(autouse=True)
def _no_ambient_tracking(monkeypatch):
    """Tests choose their tracking store explicitly."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
