"""``local`` backend: the driver is a child process of the service; its trials run in it or on an
embedded Ray (``FEDTUNE_TRIALS_THROUGH_RAY``, ``fedtune.tuning.driver.placement``).

Each driver starts in its own session (``start_new_session``), so it leads a process group that
also holds the Ray processes it spawns. Stopping a study first sends SIGINT to the driver alone
— ``run_study`` turns Ctrl-C into a clean stop: in-flight trials recorded as interrupted, MLflow
runs KILLED, Ray shut down (SIGTERM would not do: ``ray.init`` replaces the driver's SIGTERM
handler with ``sys.exit``) — then, after ``grace_s``, SIGTERM and SIGKILL to the whole group. Only processes this backend started are ever signalled: a reference
records the pid *and* its start time (``/proc/<pid>/stat`` field 22), and a pid whose start time
differs (the pid was reused) is treated as gone, never killed. A restarted service adopts the
drivers of its predecessor the same way (it cannot wait for them, so it watches ``/proc``).
A driver found dead (``kill -9``: no clean-up ran) has its study's orphaned Ray processes
stopped and its ``/tmp/fedtune-ray-*`` dir removed, unless a new driver already runs the study.
Commands are argv lists; nothing goes through a shell. A failed driver's ending
(:meth:`LocalBackend.exit_info`) is its exit status and the last error line of its log file
(``<workdir>/logs/study-<id>-<attempt>.log``: its stdout and stderr).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedtune.errors import BackendError

from ..child_env import ChildKind, child_env
from ..paths import study_workdir
from ..settings import BackendKind, Settings
from .base import (
    Backend,
    DriverExit,
    DriverStatus,
    LaunchRequest,
    check_study_id,
    last_error_line,
    python_driver_argv,
)
from .local_sandbox import driver_sandbox, sandboxes_driver

__all__ = ["LocalBackend", "process_start_ticks", "stat_fields"]

log = logging.getLogger(__name__)


def stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name (state first); None if gone.

    Args:
        pid: The process.

    Returns:
        Field 3 (state) onwards, so field ``n`` of proc(5) is item ``n - 3``; None if gone.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return stat[stat.rindex(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot; None if it is gone or a zombie."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):  # zombie / dead
        return None
    return int(fields[19])


def command_pid(outer_pid: int, relayed: bool = False) -> int | None:
    """The host PID of the command a sandbox started by ``outer_pid`` runs.

    bubblewrap's first process forks the PID namespace's init, which forks the command
    (``setpriv`` and ``prlimit`` exec into it, keeping its PID): the command is the grandchild.
    A sandbox with routes (:mod:`fedtune.sandbox_net`) is started by its outer relay, whose
    child is bubblewrap, and its command is the inner relay, which passes signals on to the
    driver: the great-grandchild.

    Args:
        outer_pid: the PID of the process the backend started (``bwrap``, or the outer relay).
        relayed: the sandbox has routes.

    Returns:
        The command's PID, or None when it is not (or no longer) running.
    """
    pid = outer_pid
    for _ in range(3 if relayed else 2):
        children = [p for p, fields in _live() if int(fields[1]) == pid]
        if len(children) != 1:
            return None
        pid = children[0]
    return pid


def _live() -> list[tuple[int, list[str]]]:
    """Every live process: (pid, its ``/proc/<pid>/stat`` fields after the command name)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name))
            if fields is not None and fields[0] not in ("Z", "X"):
                found.append((int(entry.name), fields))
    return found


def group_members(pgid: int) -> dict[int, int]:
    """Live processes of process group ``pgid``: pid -> start ticks."""
    return {pid: int(fields[19]) for pid, fields in _live() if int(fields[2]) == pgid}


#: exit codes of reaped drivers kept for their studies' next poll (oldest dropped first)
MAX_EXIT_CODES = 4096
#: how much of a failed driver's log is searched for its last error line
LOG_TAIL_BYTES = 64 * 1024


class LocalBackend(Backend):
    kind = BackendKind.LOCAL

    def __init__(
        self,
        settings: Settings,
        *,
        argv: Callable[[str, int], list[str]] = python_driver_argv,
        grace_s: float = 20.0,
        stop_children_on_close: bool = True,
    ) -> None:
        self.settings = settings
        self._argv = argv
        self.grace_s = grace_s
        self._stop_on_close = stop_children_on_close
        self._children: dict[int, subprocess.Popen] = {}
        self._exit_codes: dict[int, int] = {}  # of reaped children, by pid
        self._start_ticks: dict[int, int | None] = {}  # identifies which launch a pid was
        self._terminating: set[int] = set()  # children being stopped: reaped by _terminate only
        self._lock = threading.Lock()
        self._host = socket.gethostname()

    # ---------------------------------------------------------------- interface

    def launch(self, request: LaunchRequest) -> dict[str, Any]:
        logs = Path(self.settings.workdir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"study-{request.study_id}-{request.attempt}.log"
        argv = self._argv(request.study_id, request.attempt)
        env = self._env(request.project, request.ticket, request.code_sha256 is not None)
        sandboxed = sandboxes_driver(self.settings, request.code_sha256, env)
        if sandboxed:  # uploaded code: the driver, its Ray and its trials in one sandbox
            box = driver_sandbox(self.settings, request.study_id, env)
            argv, env = box.command(argv), dict(box.env)
        with log_path.open("ab") as out:
            try:
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(Path(self.settings.workdir).resolve()),
                    start_new_session=True,
                    close_fds=True,
                )
            except OSError as exc:
                raise BackendError(f"cannot start the study driver: {exc}") from exc
        ticks = process_start_ticks(proc.pid)
        with self._lock:
            self._children[proc.pid] = proc
            self._start_ticks[proc.pid] = ticks
            self._exit_codes.pop(proc.pid, None)
        log.info(
            "study %s: driver pid %d started%s",
            request.study_id,
            proc.pid,
            " in a sandbox" if sandboxed else "",
        )
        return {
            "pid": proc.pid,
            "start_ticks": ticks,
            "host": self._host,
            "log": str(log_path),
            "study": request.study_id,
            "sandboxed": sandboxed,
            "relayed": sandboxed,  # its network is routes: the outer relay was started
        }

    def poll(self, ref: Mapping[str, Any]) -> DriverStatus:
        status = self._poll(ref)
        if not status.alive and ref.get("study") and ref.get("host") == self._host:
            self._reap_study(str(ref["study"]))
        return status

    def exit_info(self, ref: Mapping[str, Any]) -> DriverExit:
        """The exit status of a driver this process reaped, and its log's last error line."""
        pid = int(ref["pid"])
        with self._lock:
            code = self._exit_codes.get(pid)
            if ref.get("start_ticks") != self._start_ticks.get(pid):
                code = None  # another launch's pid
        return DriverExit(code, _log_tail_line(ref.get("log")))

    def _reap_study(self, study_id: str) -> None:
        """A dead driver's Ray agents and workers (kill -9 leaves them): stopped by the study's
        temp dir, which is removed (``ray_runtime.reap_study``; skipped while a driver runs)."""
        from fedtune.tuning.driver.ray_runtime import reap_study

        try:
            reap_study(study_workdir(self.settings, check_study_id(study_id)))
        except (OSError, BackendError) as exc:
            log.warning("study %s: cleaning up after its driver failed: %s", study_id, exc)

    def _poll(self, ref: Mapping[str, Any]) -> DriverStatus:
        pid = int(ref["pid"])
        with self._lock:  # reaping and group signals never interleave (see _terminate)
            child = self._children.get(pid)
            if child is not None and pid in self._terminating:  # look, do not reap (yet)
                running = self._leader_running(pid, child, ref)
                return DriverStatus.RUNNING if running else DriverStatus.FAILED
            code = child.poll() if child is not None else None
            if code is not None:
                self._reaped(pid, code)
            code = self._exit_codes.get(pid) if child is None or code is not None else None
        if child is not None and code is None:
            return DriverStatus.RUNNING
        if code is not None and ref.get("start_ticks") == self._start_ticks.get(pid):
            return DriverStatus.SUCCEEDED if code == 0 else DriverStatus.FAILED
        return DriverStatus.RUNNING if self._is_ours(ref) else DriverStatus.GONE

    def tidy(self) -> None:
        """Reap every exited driver: a driver ends its study itself, so the
        scheduler never polls a finished study again, and without this each one stayed a
        ``<defunct>`` child of the service. Children being stopped are ``_terminate``'s to reap."""
        with self._lock:
            for pid, child in list(self._children.items()):
                if pid not in self._terminating:
                    code = child.poll()
                    if code is not None:
                        self._reaped(pid, code)

    def stop(self, ref: Mapping[str, Any]) -> None:
        pid = int(ref["pid"])
        with self._lock:
            child = self._children.get(pid)
        if child is None and not self._is_ours(ref):
            return  # gone already, or not ours: never signal it
        threading.Thread(
            target=self._terminate, args=(pid, child, dict(ref)), daemon=True, name=f"stop-{pid}"
        ).start()

    def close(self) -> None:
        """Stop the drivers this process started (their studies resume after a restart)."""
        if not self._stop_on_close:
            return
        with self._lock:
            children = dict(self._children)
        threads = []
        for pid, child in children.items():
            ref = {"pid": pid, "start_ticks": process_start_ticks(pid), "host": self._host}
            thread = threading.Thread(target=self._terminate, args=(pid, child, ref))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join(self.grace_s + 5)

    # ---------------------------------------------------------------- helpers

    def _env(
        self, project: str | None = None, ticket: str | None = None, code: bool = True
    ) -> dict[str, str]:
        """The driver's environment: the one allowlist of :mod:`..child_env`."""
        return child_env(
            self.settings, ChildKind.LOCAL_DRIVER, project=project, ticket=ticket, code=code
        )

    def _is_ours(self, ref: Mapping[str, Any]) -> bool:
        """Alive, on this host, same start time as when launched, and leading its group."""
        pid, ticks = int(ref["pid"]), ref.get("start_ticks")
        if ref.get("host") != self._host or ticks is None:
            return False
        if process_start_ticks(pid) != ticks:
            return False
        try:
            return os.getpgid(pid) == pid
        except ProcessLookupError:
            return False

    def _signal_group(self, pid: int, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def _terminate(self, pid: int, child: subprocess.Popen | None, ref: dict[str, Any]) -> None:
        """SIGINT the driver, wait ``grace_s``, SIGTERM then SIGKILL its group, reap."""
        if child is not None:
            with self._lock:
                if child.returncode is not None or pid in self._terminating:
                    return  # already reaped, or another stop is under way
                self._terminating.add(pid)
        try:
            self._terminate_group(pid, child, ref)
        finally:
            with self._lock:
                self._terminating.discard(pid)

    def _terminate_group(self, pid: int, child: subprocess.Popen | None, ref: dict) -> None:
        if child is None:
            self._terminate_adopted(pid, ref)
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(_driver_pid(pid, ref), signal.SIGINT)
        self._wait_leader(pid, child, ref, self.grace_s)
        # while the leader is unreaped (a zombie at worst) its group id cannot be reused
        for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
            with self._lock:
                if child.returncode is not None:
                    break
                self._signal_group(pid, sig)
            self._wait_leader(pid, child, ref, wait_s)
        try:
            code = child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("driver %d did not exit after SIGKILL", pid)
            return
        with self._lock:
            self._reaped(pid, code)

    def _terminate_adopted(self, pid: int, ref: dict) -> None:
        """A predecessor's driver: init reaps it, so its group id is not ours once it exits.
        Its members are listed while it is verifiably alive; later only those same processes
        (same start time) are signalled."""
        if not self._is_ours(ref):
            return
        members = group_members(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(_driver_pid(pid, ref), signal.SIGINT)
        self._wait_leader(pid, None, ref, self.grace_s)
        for sig, wait_s in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0.0)):
            for member, ticks in members.items():
                if process_start_ticks(member) == ticks:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(member, sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(
                process_start_ticks(m) == t for m, t in members.items()
            ):
                time.sleep(0.1)

    def _reaped(self, pid: int, code: int) -> None:
        """Record a reaped child's exit code (call with the lock held); the newest
        ``MAX_EXIT_CODES`` are kept, enough for every study still to be polled."""
        self._children.pop(pid, None)
        self._exit_codes[pid] = code
        while len(self._exit_codes) > MAX_EXIT_CODES:
            del self._exit_codes[next(iter(self._exit_codes))]

    def _wait_leader(self, pid: int, child: subprocess.Popen | None, ref: dict, wait_s: float):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and self._leader_running(pid, child, ref):
            time.sleep(0.1)

    def _leader_running(self, pid: int, child: subprocess.Popen | None, ref: dict) -> bool:
        if child is None:
            return self._is_ours(ref)
        try:  # WNOWAIT: look without reaping, so the pid stays ours until we are done
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return False
        return info is None


def _driver_pid(pid: int, ref: Mapping[str, Any]) -> int:
    """Where a clean stop (SIGINT) goes: the driver; in a sandbox, the command bubblewrap runs
    (it forwards no signal: the inner relay, which does, or the driver of a sandbox started
    before routes), else the process started."""
    if not ref.get("sandboxed"):
        return pid
    return command_pid(pid, bool(ref.get("relayed"))) or pid


def _log_tail_line(path: Any) -> str | None:
    """The last error line of the end of a driver's log file (None: no such file or line)."""
    if not path:
        return None
    try:
        with open(path, "rb") as log_file:
            log_file.seek(0, os.SEEK_END)
            log_file.seek(max(0, log_file.tell() - LOG_TAIL_BYTES))
            tail = log_file.read().decode("utf-8", "replace")
    except OSError:
        return None
    return last_error_line(tail)
