"""The CPU one ``fedtune mlflow-server`` start costs, up to its first healthy answer.

Each repeat starts ``python -m fedtune.cli mlflow-server --dir <fresh dir> --port <free>`` in a
session of its own (a new SQLite store, as every test's server has; the admin password from
``MLFLOW_AUTH_ADMIN_PASSWORD``, as the tests give it), polls ``/health`` until it answers 200,
then reads the CPU (user + system) of every process of the session from ``/proc``: each one's
own, and what it has collected from children it waited for (the prepare step, when it is a
process). Then it stops the session (SIGTERM) and records the whole tree's CPU at its exit
(``wait4``'s rusage: shutdown included). The polling process's own CPU is not counted.

``--root A --root B`` interleaves two checkouts (A B A B …; each imported through
``PYTHONPATH``), so that a change is measured against its parent under the same load.

Usage: ``python benchmarks/mlflow_server_start.py --root ../before --root . --repeats 3
[--out PATH]`` (writes ``benchmarks/results/mlflow_server_start.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

OUT = Path(__file__).resolve().parent / "results" / "mlflow_server_start.json"
TICK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    """A port of 127.0.0.1 nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session(sid: int) -> list[dict]:
    """Every live process of session ``sid``: pid, command line, own and children's CPU-s."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) != sid:  # proc(5) field 6, session
            continue
        found.append(
            {
                "pid": int(entry.name),
                "cmd": " ".join(a.decode(errors="replace") for a in cmdline if a)[:160],
                "own_s": (int(fields[11]) + int(fields[12])) / TICK,
                "waited_children_s": (int(fields[13]) + int(fields[14])) / TICK,
            }
        )
    return found


def one_start(root: Path, timeout: float = 180.0) -> dict:
    """One server start and stop with ``root``'s fedtune.

    Args:
        root: the checkout imported (``PYTHONPATH``).
        timeout: how long to wait for ``/health``.

    Returns:
        The CPU-s to the first healthy answer (per process and in all), the wall time to it,
        and the tree's CPU-s at exit.
    """
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(root), "MLFLOW_AUTH_ADMIN_PASSWORD": "x" * 32}
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_WORKSPACE", "MLFLOW_BACKEND_STORE_URI"):
        env.pop(name, None)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "fedtune.cli", "mlflow-server", "--dir", f"{tmp}/m"]
        log = open(f"{tmp}/log", "w")  # noqa: SIM115  (closed below)
        start = time.monotonic()
        proc = subprocess.Popen(
            [*cmd, "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp,  # not the checkout: `python -m` imports from the working directory first
            start_new_session=True,
        )
        procs: list[dict] = []
        try:
            while True:
                if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT):
                    raise RuntimeError(f"exited: {Path(tmp, 'log').read_text()}")
                if time.monotonic() - start > timeout:
                    raise TimeoutError(Path(tmp, "log").read_text()[-2000:])
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            procs = _session(proc.pid)
                            break
                except OSError:
                    pass
                time.sleep(0.1)
            healthy_wall = time.monotonic() - start
        finally:
            log.close()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "root": str(root),
        "healthy_cpu_s": round(sum(p["own_s"] + p["waited_children_s"] for p in procs), 2),
        "healthy_wall_s": round(healthy_wall, 2),
        "exit_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "processes": procs,
    }


def main() -> None:
    """Interleave the roots' starts and print and write each root's medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", action="append", type=Path, default=[])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    roots = [r.resolve() for r in args.root] or [Path(__file__).resolve().parent.parent]
    runs = []
    for _ in range(args.repeats):
        for root in roots:
            run = one_start(root)
            runs.append(run)
            print(json.dumps({k: v for k, v in run.items() if k != "processes"}), flush=True)
            for p in run["processes"]:
                print(f"   {p['own_s']:6.2f} + {p['waited_children_s']:5.2f}  {p['cmd']}")
    summary = {
        str(root): {
            key: statistics.median(r[key] for r in runs if r["root"] == str(root))
            for key in ("healthy_cpu_s", "exit_cpu_s", "healthy_wall_s")
        }
        for root in roots
    }
    print(json.dumps(summary, indent=1))
    args.out.write_text(
        json.dumps({"environment": environment(), "medians": summary, "runs": runs}, indent=1)
    )


if __name__ == "__main__":
    main()
