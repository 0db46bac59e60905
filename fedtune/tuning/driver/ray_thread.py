"""An embedded Ray owned by one thread, which can be stopped while it is still starting.

:class:`RayThread` starts the study's embedded Ray (:func:`.ray_session.ray_session`) in a
thread of its own, holds it until :meth:`RayThread.stop`, and shuts it down there: Ray starts
its GCS and raylet with ``PR_SET_PDEATHSIG``, which Linux fires when the *thread* that started
them ends, so the thread lives as long as Ray. The study's thread waits for it with
:meth:`RayThread.ready` and meanwhile does the rest of its start-up.

**Stopping a start.** ``ray.init`` has no way to be cancelled, and a study that learns it will
not need Ray — the task cannot be built (:mod:`.preflight`), the spec is wrong, the trials run
in the driver's process (:mod:`.in_process`) — would otherwise wait for Ray's whole start
(4–20 s on two shared CPUs) and then its shutdown before it could say so.
:meth:`RayThread.abort` raises :class:`RayStartAborted` in the starting thread
(``PyThreadState_SetAsyncExc``), a ``BaseException``, so no ``except Exception`` in Ray's start
swallows it. Python raises such an exception wherever the thread next checks for one, and not
every place is safe: a stop that landed just after ``logging`` took its module lock and before
its ``try`` left that lock taken for good (the process hung at its next log call), and one that
landed in an import left a module half made (``ray`` itself, on its first import). So it is
sent only where the thread waits in ``ray.init`` (or :func:`.ray_runtime.start_ray` between
attempts), not importing: in a ``sleep(...)`` of a polling loop (``ray.init`` waiting for its
dashboard process), or in the call that waits for the node to register
(``GlobalState.get_node``); it is raised when that call returns, on that line, where nothing
is held (killing Ray's processes to end that wait sooner makes it longer: the call then waits
30 s for its GCS). :meth:`RayThread.abort` looks every 10 ms, holding the interpreter lock so
that the thread cannot move meanwhile, until the thread is at such a place or Ray has come up:
then the thread itself raises it, in fedtune's code, and Ray is shut down as usual. Either way the session's clean-up runs as after a failed start: the processes
begun so far are killed (found by the study's temp dir, :func:`.ray_runtime.reap_orphans`; those
the thread began also die with it), the temp dir is removed, and ``ray.shutdown()`` clears what
the half-run ``ray.init`` set in this process, so that a later start here begins clean (tested).
The exception is sent at most once, and only while Ray is starting; a Ray that runs is stopped
by the ordinary shutdown.

Light on purpose: Ray is imported by the thread, not at import.
"""

from __future__ import annotations

import contextlib
import ctypes
import linecache
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from ..common import timeline

__all__ = ["RayStartAborted", "RayThread", "waiting_in_ray_start"]

#: the files of the functions whose polling loops a stop may land in: ``ray.init`` and ours
_STARTS = (os.path.join("ray", "_private", "worker.py"), os.path.join("driver", "ray_runtime.py"))
_STATE = os.path.join("ray", "_private", "state.py")


class RayStartAborted(BaseException):
    """Raised in a :class:`RayThread` whose start was stopped (and by its ``ready``)."""


# the thread's states: not begun, in ``ray.init``, its start being stopped, Ray runs, ended
_NEW, _STARTING, _STOPPING, _RUNNING, _ENDED = "new", "starting", "stopping", "running", "ended"


def waiting_in_ray_start(frame: FrameType) -> bool:
    """Whether a thread whose innermost frame is ``frame`` waits, inside ``ray.init`` (or
    ``start_ray`` between attempts), where a stop lands safely (module docstring): in a
    ``sleep(...)`` of a polling loop, or in the call that waits for the node to register with
    the GCS (``GlobalState.get_node``)."""
    code = frame.f_code
    line = linecache.getline(code.co_filename, frame.f_lineno).strip()
    waiting = line.startswith(("time.sleep(", "sleep(")) or (
        code.co_name == "get_node" and code.co_filename.endswith(_STATE)
    )
    while waiting and frame is not None:
        code = frame.f_code
        if code.co_name in ("init", "start_ray") and code.co_filename.endswith(_STARTS):
            return True
        frame = frame.f_back
    return False


class RayThread:
    """The study's embedded Ray, started and shut down by a thread of its own.

    Args:
        workdir: The study's directory (its lock is held by the caller: the temp dir is its).
        runtime_env: The job's ``runtime_env`` (the study's code), if any.
        session: The context manager that starts and stops Ray (``ray_session``'s signature:
            ``(workdir, address, runtime_env)``, yielding whether ``runtime_env`` is the job's).
        marks: The timeline's names for the start and for Ray running.
        safe: Whether a stop may land in the starting thread now, given its innermost frame
            (default :func:`waiting_in_ray_start`).
    """

    def __init__(
        self,
        workdir: Path,
        runtime_env: dict[str, Any] | None = None,
        *,
        session: Callable[..., Any] | None = None,
        marks: tuple[str, str] = ("ray_start", "ray_ready"),
        safe: Callable[[FrameType], bool] = waiting_in_ray_start,
    ) -> None:
        self.workdir = Path(workdir)
        self._env = runtime_env
        self._session = session
        self._marks = marks
        self._safe = safe
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards _state: an abort is sent only while starting
        self._state = _NEW
        self._started = threading.Event()  # Ray runs, or its start ended otherwise (_error)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._shipped = False

    def start(self) -> RayThread:
        """Begin Ray's start in the thread (``fedtune-ray``, a daemon).

        Returns:
            This handle.
        """
        self._thread = threading.Thread(target=self._run, name="fedtune-ray", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        session = self._session
        if session is None:
            from .ray_session import ray_session as session
        import ray  # noqa: F401 — imported before the start can be stopped (never mid-import)

        try:
            with self._lock:
                if self._stop.is_set():  # stopped before it began: nothing to start
                    return
                self._state = _STARTING
            timeline.mark(self._marks[0])
            with session(self.workdir, None, self._env) as shipped:
                with self._lock:
                    if self._state == _STOPPING:  # stopped as it came up: not sent, raised here
                        self._state = _ENDED
                        raise RayStartAborted("Ray's start was stopped")
                    self._state = _RUNNING
                self._shipped = bool(shipped)
                timeline.mark(self._marks[1])
                self._started.set()
                self._stop.wait()
        except BaseException as exc:  # re-raised in the study's thread by ready()
            self._error = exc
            if isinstance(exc, RayStartAborted):
                _clear_half_started()
        finally:
            with self._lock:
                self._state = _ENDED
            self._started.set()
            timeline.mark("ray_stopped")

    def ready(self) -> bool:
        """Wait until Ray runs.

        Returns:
            Whether the study's code reaches the trials through the job's ``runtime_env``.

        Raises:
            RayStartAborted: The start was stopped (:meth:`abort`, :meth:`stop`).
            RayStartError: Ray did not start.
        """
        if self._thread is None:
            raise RayStartAborted("Ray's start was never begun")
        self._started.wait()
        if self._error is not None:
            raise self._error
        if self._state == _ENDED:
            raise RayStartAborted("Ray was stopped before it ran")
        return self._shipped

    def abort(self) -> bool:
        """Stop Ray's start if it has not finished; a Ray that runs is left running (the
        study's thread may be using it: :meth:`stop` shuts it down).

        The exception is sent only where it lands safely (module docstring): this waits, in
        steps of 10 ms, for the thread to be at such a place, or for Ray to come up (then the
        thread raises it itself and shuts Ray down).

        Returns:
            Whether a start was stopped (False: Ray runs already, or the thread has ended).
        """
        with self._lock:
            if self._state == _NEW:
                self._stop.set()  # the thread, if it begins, starts nothing
                return True
            if self._state != _STARTING or self._thread is None or self._thread.ident is None:
                return False
            self._stop.set()
            self._state = _STOPPING  # decided once: later calls send nothing
            ident = self._thread.ident
        timeline.mark("ray_start_stopped")
        while True:
            with self._lock:
                if self._state != _STOPPING or _send_at_safe_point(ident, self._safe):
                    return True  # sent, or the thread has come up or ended: it raises itself
            time.sleep(0.01)

    def stop(self) -> None:
        """Shut Ray down, or stop its start if it is still starting, and wait for the thread;
        idempotent. The caller's thread does nothing with Ray meanwhile
        (``docs/explanation/architecture.md``, *Ray's shutdown*)."""
        self.abort()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def _send_at_safe_point(ident: int, safe: Callable[[FrameType], bool]) -> bool:
    """Raise :class:`RayStartAborted` in the thread ``ident`` if ``safe`` accepts where it is
    and it is not importing a module.

    The thread cannot move between the look and the send: this thread holds the interpreter
    lock throughout (a long switch interval meanwhile; ``pythonapi`` calls keep the lock).

    Returns:
        Whether it was sent.
    """
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    try:
        innermost = frame = sys._current_frames().get(ident)
        while frame is not None:
            if frame.f_code.co_filename.startswith("<frozen importlib._bootstrap"):
                return False
            frame = frame.f_back
        if innermost is None or not safe(innermost):
            return False
        _raise_in(ident, RayStartAborted)
        return True
    finally:
        sys.setswitchinterval(interval)


def _raise_in(ident: int, kind: type[BaseException] | None) -> None:
    """Raise ``kind`` in the thread ``ident`` at its next bytecode (None: clear what is
    pending)."""
    exc = ctypes.py_object(kind) if kind is not None else None
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), exc)
    if done > 1:  # never: one thread has this id (undo, as the C API asks)
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)


def _clear_half_started() -> None:
    """What a stopped ``ray.init`` left in this process (its driver's connection, Ray's
    internal key-value client) is cleared, so that a later start begins clean."""
    import ray

    with contextlib.suppress(Exception):
        ray.shutdown()
