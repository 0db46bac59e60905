"""The local backend with real child processes (a stand-in driver, not a study)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedtune.service.backends.base import DriverStatus, LaunchRequest, python_driver_argv
from fedtune.service.backends.local import LocalBackend, process_start_ticks
from tests.procs import signals

SID = "0123456789ab"

# A stand-in driver: starts a grandchild (as Ray would), records both pids and the environment,
# then sleeps; IGNORE_SIGNALS makes it ignore SIGINT and SIGTERM; EXIT=<n> makes it exit at once
# (the test's variables, handed over as arguments: a driver inherits only the allowlist's).
DRIVER = r"""
import json, os, signal, subprocess, sys, time
out, ignore_signals, exit_code = sys.argv[1:4]
if ignore_signals:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as the real driver does
if exit_code:
    sys.exit(int(exit_code))
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
env = {k: os.environ.get(k) for k in ("FEDTUNE_DATABASE_URL", "FEDTUNE_API_TOKEN", "RAY_ADDRESS")}
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "child": child.pid, "env": env}, f)
os.rename(out + ".tmp", out)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    return process_start_ticks(pid) is not None


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def backend(make_settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FEDTUNE_API_TOKEN", "s" * 32)
    monkeypatch.setenv("RAY_ADDRESS", "http://somewhere:8265")
    info = tmp_path / "driver.json"
    settings = make_settings(backend="local", database_url="sqlite:////tmp/never-opened.db")

    def argv(sid: str, attempt: int) -> list[str]:
        knobs = [os.environ.get("IGNORE_SIGNALS", ""), os.environ.get("EXIT", "")]
        return [sys.executable, "-c", DRIVER, str(info), *knobs]

    b = LocalBackend(settings, argv=argv, grace_s=1.0)
    b.info = info
    yield b
    b.close()


def _info(b: LocalBackend) -> dict:
    assert _wait_for(b.info.exists), "the stand-in driver did not start"
    return json.loads(b.info.read_text())


def test_launch_poll_stop_kills_the_whole_group(backend: LocalBackend) -> None:
    ref = backend.launch(LaunchRequest(SID, 1))
    info = _info(backend)
    assert ref["pid"] == info["pid"] and ref["start_ticks"] == process_start_ticks(ref["pid"])
    assert backend.poll(ref) == DriverStatus.RUNNING
    assert info["env"] == {
        "FEDTUNE_DATABASE_URL": "sqlite:////tmp/never-opened.db",
        "FEDTUNE_API_TOKEN": None,
        "RAY_ADDRESS": None,
    }
    assert Path(ref["log"]).name == f"study-{SID}-1.log"
    backend.stop(ref)
    assert _wait_for(lambda: backend.poll(ref) == DriverStatus.FAILED)
    assert _wait_for(lambda: not _alive(info["child"]))


def test_a_driver_ignoring_signals_is_killed_after_the_grace(backend, monkeypatch) -> None:
    monkeypatch.setenv("IGNORE_SIGNALS", "1")
    ref = backend.launch(LaunchRequest(SID, 1))
    info = _info(backend)
    started = time.monotonic()
    backend.stop(ref)
    assert _wait_for(lambda: not _alive(info["pid"]) and not _alive(info["child"]))
    assert time.monotonic() - started >= 2.9  # SIGKILL came after grace_s + the SIGTERM wait
    assert backend.poll(ref) == DriverStatus.FAILED


@pytest.mark.parametrize(
    ("code", "status"), [(0, DriverStatus.SUCCEEDED), (3, DriverStatus.FAILED)]
)
def test_exit_codes(backend: LocalBackend, monkeypatch, code: int, status: DriverStatus) -> None:
    monkeypatch.setenv("EXIT", str(code))
    ref = backend.launch(LaunchRequest(SID, 1))
    assert _wait_for(lambda: backend.poll(ref) == status)


def test_a_restarted_service_adopts_and_can_stop_its_drivers(backend, make_settings) -> None:
    ref = backend.launch(LaunchRequest(SID, 1))
    info = _info(backend)
    successor = LocalBackend(make_settings(backend="local"), grace_s=1.0)
    assert successor.poll(ref) == DriverStatus.RUNNING  # via /proc, not a child of it
    successor.stop(ref)
    assert _wait_for(lambda: not _alive(info["pid"]) and not _alive(info["child"]))
    assert successor.poll(ref) == DriverStatus.GONE


#: a process of somebody else's: it blocks SIGINT and SIGTERM, so that one sent to it stays
#: pending (read in /proc) rather than ending it at a moment the test would have to wait for
STRANGER = (
    "import signal, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})\n"
    "time.sleep(30)\n"
)


def _signal_masks(pid: int) -> dict[str, set[int]]:
    """The signals ``pid`` blocks and those sent to it but not yet taken, from /proc.

    Args:
        pid: The process.

    Returns:
        ``{"blocked": ..., "pending": ...}``: signal numbers (pending: sent to the process
        or to its main thread).
    """
    status = Path(f"/proc/{pid}/status").read_text()
    return {"blocked": signals(status, "SigBlk"), "pending": signals(status, "SigPnd", "ShdPnd")}


def test_processes_that_are_not_ours_are_never_signalled(make_settings) -> None:
    stranger = subprocess.Popen([sys.executable, "-c", STRANGER], start_new_session=True)
    try:
        b = LocalBackend(make_settings(backend="local"), grace_s=0.5)
        ticks = process_start_ticks(stranger.pid)
        wanted = {signal.SIGINT, signal.SIGTERM}
        assert _wait_for(lambda: _signal_masks(stranger.pid)["blocked"] >= wanted), (
            "the stranger did not block SIGINT and SIGTERM"
        )
        reused = {"pid": stranger.pid, "start_ticks": ticks - 1, "host": b._host}
        other_host = {"pid": stranger.pid, "start_ticks": ticks, "host": "another-node"}
        threads = set(threading.enumerate())
        for ref in (reused, other_host):
            assert b.poll(ref) == DriverStatus.GONE
            b.stop(ref)
        for thread in set(threading.enumerate()) - threads:  # a stop under way: let it end
            thread.join(30)
        assert stranger.poll() is None  # still running (SIGKILL cannot be blocked) ...
        assert _signal_masks(stranger.pid)["pending"] == set()  # ... and sent nothing
    finally:
        os.killpg(stranger.pid, signal.SIGKILL)
        stranger.wait()


def test_close_stops_the_children(backend: LocalBackend) -> None:
    backend.launch(LaunchRequest(SID, 1))
    info = _info(backend)
    backend.close()
    assert not _alive(info["pid"]) and _wait_for(lambda: not _alive(info["child"]))


def test_the_real_driver_command_is_an_argv_list() -> None:
    argv = python_driver_argv(SID, 2)
    assert argv[0] == sys.executable and argv[-5:] == ["worker", "run-study", SID, "--attempt", "2"]
    with pytest.raises(Exception, match="12 hex"):
        python_driver_argv("abc; rm -rf /", 1)
    # it runs fedtune's main as the process's entry point: the driver's start is paused
    # (fedtune.tuning.common.start_gc); the verb's work is replaced by a report of the collector
    probe = (
        "import gc; from fedtune import cli; from fedtune.tuning.common import start_gc; "
        "cli._run = lambda args: print(gc.isenabled(), start_gc.paused(), args.study_id) or 0; "
    )
    run = subprocess.run(
        [argv[0], "-c", probe + argv[2], *argv[3:]], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True", SID]


# A stand-in driver of study SID as run_study is: it holds the study's lock and starts a "Ray
# agent" that keeps a log file open in the study's Ray temp dir, then waits to be killed.
RAY_DRIVER = r"""
import fcntl, json, os, subprocess, sys, time
workdir, temp, out = sys.argv[1:4]
os.makedirs(workdir, exist_ok=True)
lock = open(os.path.join(workdir, ".lock"), "a+")
fcntl.flock(lock, fcntl.LOCK_EX)
logs = os.path.join(temp, "session_1", "logs")
os.makedirs(logs, exist_ok=True)
with open(os.path.join(logs, "dashboard_agent.out"), "w") as log:
    agent = subprocess.Popen(["sleep", "600"], stdout=log)  # renamed ray::DashboardAgent in Ray
with open(out + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "child": agent.pid}, f)
os.rename(out + ".tmp", out)
time.sleep(600)
"""


def test_a_killed_drivers_ray_processes_are_reaped_and_its_temp_dir_removed(
    make_settings, tmp_path: Path
) -> None:
    """The service cleans up after a driver killed with SIGKILL."""
    from fedtune.service.paths import study_workdir
    from fedtune.tuning.driver.ray_runtime import ray_temp_dir

    settings = make_settings(backend="local", database_url="sqlite:////tmp/never-opened.db")
    workdir = study_workdir(settings, SID)
    temp = ray_temp_dir(workdir)
    assert str(temp).startswith("/tmp/fedtune-ray-")
    info = tmp_path / "driver.json"
    argv = lambda sid, attempt: [  # noqa: E731
        sys.executable,
        "-c",
        RAY_DRIVER,
        str(workdir),
        str(temp),
        str(info),
    ]
    b = LocalBackend(settings, argv=argv, grace_s=1.0)
    b.info = info
    try:
        ref = b.launch(LaunchRequest(SID, 1))
        pids = _info(b)
        assert b.poll(ref) == DriverStatus.RUNNING and temp.is_dir()
        os.kill(pids["pid"], signal.SIGKILL)
        assert _alive(pids["child"])  # the "agent" outlives its driver
        assert _wait_for(lambda: b.poll(ref) == DriverStatus.FAILED)
        assert not _alive(pids["child"]) and not temp.exists()
    finally:
        b.close()
        if "pids" in locals() and _alive(pids["child"]):
            os.kill(pids["child"], signal.SIGKILL)
