"""Helpers shared by the service tests and the service end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from fedtune.errors import BackendError
from fedtune.service.backends.base import Backend, DriverStatus, LaunchRequest
from fedtune.service.settings import BackendKind
from fedtune.service.testing import temporary_pg_database, temporary_pg_schema
from tests.ports import free_port

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
PG_URL = os.environ.get("FEDTUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def tiny_spec(name: str = "tiny", trials: int = 2, rounds: int = 4, **extra: Any) -> dict:
    """A quadratic study small enough for a test (seconds per trial, mostly Ray start-up)."""
    spec = {
        "name": name,
        "task": {"name": "quadratic", "clients": 6, "dim": 3},
        "algorithm": "fedavg",
        "train": {"rounds": rounds, "clients_per_round": 3, "local_steps": 2, "batch_size": 2},
        "objective": {"last_rounds": 2},
        "scheduler": {"name": "none"},
        "sampler": {"name": "random", "seed": 0},
        # rates small enough that no trial diverges: every trial runs all its rounds
        "search": {
            "override": {
                "client_lr": {"high": 0.05, "default": 0.01},
                "server_lr": {"high": 0.5, "default": 0.1},
            }
        },
        "budget": {"trials": trials, "max_concurrent": 1},
    }
    spec.update(extra)
    return spec


# ---------------------------------------------------------------------- PostgreSQL


def pg_unreachable_reason() -> str | None:
    """None when PostgreSQL answers at PG_URL, else why not (printed by the skipping test)."""
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as exc:
        return f"PostgreSQL at {PG_URL} unreachable: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def pg_schema():
    """A fresh schema; yields a URL whose search_path is that schema; drops it afterwards."""
    return temporary_pg_schema(PG_URL, "fedtune_test")


def pg_database(prefix: str = "fedtune_test"):
    """A just-created database; yields its URL; drops it afterwards. For a test that depends
    on what other sessions do (another worker's open transactions hold back ``VACUUM``), and
    for a new MLflow store (its tables go to ``public``)."""
    return temporary_pg_database(PG_URL, prefix)


# ---------------------------------------------------------------------- a scripted backend


class FakeBackend(Backend):
    """A backend whose drivers are entries of a dict the test edits."""

    kind = BackendKind.LOCAL

    def __init__(self) -> None:
        self.launched: list[LaunchRequest] = []
        self.stopped: list[dict] = []
        self.status: dict[tuple[str, int], DriverStatus] = {}
        self.refuse_launch = False
        self.poll_error = False
        self.stop_ends = True  # False: a stopped driver keeps running until ``finish``

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        if self.refuse_launch:
            raise BackendError("cluster unreachable")
        self.launched.append(request)
        self.status[(request.study_id, request.attempt)] = DriverStatus.RUNNING
        return {"study": request.study_id, "attempt": request.attempt}

    def poll(self, ref: Mapping[str, Any]) -> DriverStatus:
        if self.poll_error:
            raise BackendError("cannot tell")
        return self.status.get((ref["study"], ref["attempt"]), DriverStatus.GONE)

    def stop(self, ref: Mapping[str, Any]) -> None:
        self.stopped.append(dict(ref))
        if self.stop_ends:
            self.status[(ref["study"], ref["attempt"])] = DriverStatus.FAILED

    def finish(self, study_id: str, attempt: int, status: DriverStatus) -> None:
        self.status[(study_id, attempt)] = status


# ---------------------------------------------------------------------- a real server


class Server:
    """``fedtune serve`` in a subprocess on a free port; stopped (or SIGKILLed) by its PID."""

    def __init__(
        self, env: Mapping[str, str], log: Path, port: int | None = None, args: tuple = ()
    ) -> None:
        self.args = tuple(args)  # more options of ``fedtune serve``
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {**os.environ, **env}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60.0) -> Server:
        argv = [
            PYTHON,
            "-m",
            "fedtune.cli",
            "serve",
            "--port",
            str(self.port),
            "--log-level",
            "info",
            *self.args,
        ]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, cwd=str(REPO)
            )
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2) as http:  # one client: a new one costs ~25 ms of CPU a poll
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"server exited {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.url}/readyz").status_code == 200:
                        return self
                time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log.read_text()[-3000:]}")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(40)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


def until(predicate, timeout: float, every: float = 0.5):
    """Poll ``predicate`` until it returns something truthy or ``timeout`` s pass; its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    return predicate()


def running_study(ctx: Any, **spec: Any) -> str:
    """Submit ``tiny_spec(**spec)`` and mark it RUNNING at attempt 1, as a dispatch would."""
    from fedtune.service.repository import Repository
    from fedtune.service.services import submit_study
    from fedtune.service.states import StudyState

    sid = submit_study(ctx, tiny_spec(**spec))[0].id
    with ctx.db.session() as s:
        Repository(s).transition(sid, StudyState.RUNNING, attempts=1)
    return sid
