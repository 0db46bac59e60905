"""A throw-away local Ray cluster for the ``ray`` backend tests, and a ``ray stop`` that stops
only it.

``ray start --head`` runs in a new session (``start_new_session``) with free ports and its own
``--temp-dir`` (so its address file never makes anyone else's ``ray.init()`` connect to it) and
token authentication with a token of its own (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``;
:attr:`LocalRayCluster.client_env` is what a client needs to talk to it).
Every process of that cluster keeps the session id. Plain ``ray stop`` kills *every* Ray
process of the machine — other people's clusters included — so :meth:`LocalRayCluster.stop`
runs Ray's own ``ray stop`` with its process scan restricted to that session, then SIGKILLs
whatever of the session is left.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .helpers import free_port

BIN = Path(sys.executable).parent

_STOP = r"""
import os, sys
import ray  # noqa: F401 - puts Ray's vendored psutil on sys.path
import psutil
session = int(sys.argv[1])
scan = psutil.process_iter
def ours(*args, **kwargs):
    for proc in scan(*args, **kwargs):
        try:
            if os.getsid(proc.pid) == session:
                yield proc
        except OSError:
            continue
psutil.process_iter = ours
from ray.scripts.scripts import cli
sys.argv = ["ray", "stop", "--grace-period", "10"]
cli()
"""


def session_pids(session: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.getsid(int(entry)) == session:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


class LocalRayCluster:
    def __init__(self, env: Mapping[str, str]) -> None:
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ftray-", dir="/tmp"))  # short: socket paths
        self.dashboard_port = free_port()
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        self.env = {**os.environ, **env, **self.client_env, "RAY_USAGE_STATS_ENABLED": "0",
                    "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}  # fmt: skip
        self.env.pop("RAY_ADDRESS", None)
        self.session: int | None = None

    def start(self) -> LocalRayCluster:
        ports = {
            "port": free_port(), "dashboard-port": self.dashboard_port,
            "ray-client-server-port": free_port(), "node-manager-port": free_port(),
            "object-manager-port": free_port(), "dashboard-agent-listen-port": free_port(),
            "dashboard-agent-grpc-port": free_port(), "metrics-export-port": free_port(),
            "runtime-env-agent-port": free_port(),
        }  # fmt: skip
        argv = [str(BIN / "ray"), "start", "--head", "--num-cpus=1", "--disable-usage-stats",
                f"--temp-dir={self.temp_dir}", "--dashboard-host=127.0.0.1",
                "--include-dashboard=true", "--object-store-memory=100000000",
                *(f"--{k}={v}" for k, v in ports.items())]  # fmt: skip
        proc = subprocess.Popen(argv, env=self.env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        self.session = proc.pid
        out, _ = proc.communicate(timeout=180)
        if proc.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start failed:\n{out.decode()[-3000:]}")
        return self

    def stop(self) -> None:
        if self.session is None:
            return
        subprocess.run([sys.executable, "-c", _STOP, str(self.session)], env=self.env,
                       capture_output=True, timeout=120, check=False)  # fmt: skip
        for pid in session_pids(self.session):  # stragglers of *this* session only
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        self.session = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)
