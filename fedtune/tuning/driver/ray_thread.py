"""An embedded Ray owned by one thread, which can be stopped while it is still starting.

:class:`RayThread` starts the study's embedded Ray (:func:`.ray_session.ray_session`) in a
thread of its own, holds it until :meth:`RayThread.stop`, and shuts it down there: Ray starts
its GCS and raylet with ``PR_SET_PDEATHSIG``, which Linux fires when the *thread* that started
them ends, so the thread lives as long as Ray. The study's thread waits for it with
:meth:`RayThread.ready` and meanwhile does the rest of its start-up.

**Stopping a start.** ``ray.init`` has no way to be cancelled, and a study that learns it will
not need Ray — the task cannot be built (:mod:`.preflight`), the spec is wrong, the trials run
in the driver's process (:mod:`.in_process`) — would otherwise wait for Ray's whole start
(4–14 s on two CPUs) and then its shutdown before it could say so. :meth:`RayThread.abort`
raises :class:`RayStartAborted` in the starting thread (``PyThreadState_SetAsyncExc``), which
Python delivers at that thread's next bytecode, after the blocking call it may be in has
returned (measured 0.3–1.1 s from the abort to the thread's end, wherever the start was). It
is a ``BaseException``, so no ``except Exception`` in Ray's start swallows it. The session's
own clean-up then runs as after a failed start: the processes begun so far are stopped (found
by the study's temp dir, :func:`.ray_runtime.reap_orphans`; those the thread began also die
with it) and the temp dir is removed; ``ray.shutdown()`` clears what the half-run ``ray.init``
set in this process, so a later start here begins clean (tested). Only a start is aborted:
the exception is sent while the thread is starting, under the lock it takes to say that Ray
runs, so it never lands in a shutdown. A Ray that runs is stopped by the ordinary shutdown.

Light on purpose: Ray is imported by the thread, not at import.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import timeline

__all__ = ["RayStartAborted", "RayThread"]


class RayStartAborted(BaseException):
    """Raised in a :class:`RayThread` whose start was stopped (and by its ``ready``)."""


# the thread's states: not begun, in ``ray.init``, its start being stopped, Ray runs, ended
_NEW, _STARTING, _STOPPING, _RUNNING, _ENDED = "new", "starting", "stopping", "running", "ended"


class RayThread:
    """The study's embedded Ray, started and shut down by a thread of its own.

    Args:
        workdir: The study's directory (its lock is held by the caller: the temp dir is its).
        runtime_env: The job's ``runtime_env`` (the study's code), if any.
        session: The context manager that starts and stops Ray (``ray_session``'s signature:
            ``(workdir, address, runtime_env)``, yielding whether ``runtime_env`` is the job's).
        marks: The timeline's names for the start and for Ray running.
    """

    def __init__(
        self,
        workdir: Path,
        runtime_env: dict[str, Any] | None = None,
        *,
        session: Callable[..., Any] | None = None,
        marks: tuple[str, str] = ("ray_start", "ray_ready"),
    ) -> None:
        self.workdir = Path(workdir)
        self._env = runtime_env
        self._session = session
        self._marks = marks
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
        try:
            with self._lock:
                if self._stop.is_set():  # stopped before it began: nothing to start
                    return
                self._state = _STARTING
            timeline.mark(self._marks[0])
            with session(self.workdir, None, self._env) as shipped:
                with self._lock:
                    if self._state == _STOPPING:  # stopped as it came up: not delivered yet
                        _raise_in(threading.get_ident(), None)  # raised here instead, once
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
        """Stop Ray's start if it has not finished, without waiting; a Ray that runs is left
        running (the study's thread may be using it: :meth:`stop` shuts it down).

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
            _raise_in(self._thread.ident, RayStartAborted)
            self._state = _STOPPING  # sent once: a second one could land in the clean-up
            timeline.mark("ray_start_stopped")
            return True

    def stop(self) -> None:
        """Shut Ray down, or stop its start if it is still starting, and wait for the thread;
        idempotent. The caller's thread does nothing with Ray meanwhile
        (``docs/explanation/architecture.md``, *Ray's shutdown*)."""
        self.abort()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


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
