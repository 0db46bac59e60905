"""The study's MLflow store served from a process of its own, for a driver that trains.

A study whose trials run in the driver's process (:mod:`..driver.in_process`) would otherwise
import MLflow in that process (seconds of CPU, under the interpreter lock the trials need)
and send its rounds from threads beside the training. :class:`TrackerProcess` starts a child
process at once — ``fedtune tune`` starts it before it imports the engine — which imports
MLflow and :class:`~.tracking.StudyTracker` on another CPU while the driver imports torch,
opens the store when asked (:meth:`TrackerProcess.open`) and then serves the tracker's calls;
:class:`ProcessTracker` is the driver's :class:`~.tracker.Tracker`, each of its methods a
call to the child's. So the driver never
imports MLflow.

A call waits for its answer, and an error raised in the child is raised in the driver (the
same exception when it can be pickled, else a ``RuntimeError`` naming it). The child ignores
SIGINT (Ctrl-C reaches the whole process group, and the driver's clean-up still needs the
store), and ends when the driver closes it (storing what is queued, then exiting without the
interpreter's teardown) or its pipe (the driver exited).

The child's start (MLflow's import, the store's opening, pandas) runs with Python's cyclic
garbage collector paused (:mod:`..common.start_gc`).

Light on purpose: MLflow is imported by the child only.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..common import start_gc
from .record import study_record
from .tracker import Tracker

if TYPE_CHECKING:
    from ..spec import StudySpec
    from .tracking import StudyTracker

__all__ = ["ProcessTracker", "TrackerProcess"]

_OPEN = "__open__"
#: the tracker's methods served to the driver (:class:`ProcessTracker` calls them by name): the
#: protocol's, but ``start_study`` arrives as ``start_record`` (the child never parses a spec)
_SERVED = (
    frozenset(n for n, v in vars(Tracker).items() if callable(v) and not n.startswith("_"))
    - {"start_study"}
) | {"start_record"}


class TrackerProcess:
    """A child process that imports MLflow now and serves one study's tracker (module
    docstring); opened again, it serves the next study's (a study of methods runs its
    studies one after another with one process, importing MLflow once)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no torch, no threads
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child,), name="fedtune-mlflow", daemon=True
        )
        self._process.start()
        child.close()
        self._lock = threading.Lock()
        self._closed = False

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Call the tracker's ``name`` in the child and return what it returned.

        Raises:
            Exception: What the call raised in the child.
            RuntimeError: The child is gone.
        """
        with self._lock:
            try:
                self._conn.send((name, args, kwargs))
                ok, value = self._conn.recv()
            except (EOFError, OSError) as exc:
                raise RuntimeError(f"the study's MLflow process ended ({exc!r})") from None
        if not ok:
            raise value
        return value

    def open(
        self, uri: str, experiment: str, artifact_root: str | None, user: str | None = None
    ) -> ProcessTracker:
        """Open the study's MLflow store in the child (as :class:`~.tracking.StudyTracker`);
        the tracker of a study opened before in it stores what it queued and is dropped.

        Args:
            uri: The tracking URI.
            experiment: The experiment's name.
            artifact_root: Where a new experiment keeps its artifacts (None: the store's).
            user: Whom the runs name as their user (``mlflow.user``; None: nobody).

        Returns:
            The driver's handle.
        """
        uri, experiment_id = self.call(_OPEN, uri, experiment, artifact_root, user=user)
        return ProcessTracker(self, uri, experiment_id)

    def close(self, timeout: float = 60.0) -> None:
        """End the child (its tracker's thread has stopped with ``finish_study``); again: no-op."""
        if self._closed:
            return
        self._closed = True
        with self._lock, contextlib.suppress(OSError, EOFError, ValueError):
            self._conn.send(None)
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(10)
        self._conn.close()


class ProcessTracker(Tracker):
    """The driver's :class:`~.tracker.Tracker` on a :class:`~.tracking.StudyTracker` in a
    :class:`TrackerProcess`: each method is the child tracker's, called over the pipe.

    Args:
        process: The child.
        uri: The store's URI.
        experiment_id: The study's experiment.
    """

    def __init__(self, process: TrackerProcess, uri: str, experiment_id: str) -> None:
        self._process, self.uri, self.experiment_id = process, uri, experiment_id

    def start_study(
        self, spec: StudySpec, space_dict: Mapping[str, Any], run_id: str | None
    ) -> str:
        # the spec's record is made here: the child never parses a spec
        return self._process.call("start_record", study_record(spec), dict(space_dict), run_id)

    def finish_study(
        self,
        run_id: str,
        metrics: Mapping[str, float],
        status: str,
        artifacts: Path | None = None,
        artifact_path: str | None = None,
        step: int = 0,
    ) -> None:
        call = self._process.call
        call("finish_study", run_id, metrics, status, artifacts, artifact_path, step=step)

    def log_series(self, run_id: str, key: str, points: Iterable[tuple[int, float]]) -> None:
        self._process.call("log_series", run_id, key, list(points))  # an iterable: a list

    def mark_best(self, parent: str, best_run: str | None, number: int | None) -> None:
        self._process.call("mark_best", parent, best_run, number)

    def log_table(
        self, run_id: str, columns: Mapping[str, list], name: str, note: str | None = None
    ) -> None:
        self._process.call("log_table", run_id, columns, name, note)

    def read_text(self, run_id: str, path: str) -> str:
        return self._process.call("read_text", run_id, path)

    def log_json(self, run_id: str, data: Any, name: str) -> None:
        self._process.call("log_json", run_id, data, name)

    def start_trial(
        self, parent: str, number: int, params: Mapping[str, Any], tags: Mapping[str, str]
    ) -> str:
        return self._process.call("start_trial", parent, number, params, tags)

    def log_rounds(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> None:
        self._process.call("log_rounds", run_id, list(rows))  # an iterable: sent as a list

    def end_trial(
        self,
        run_id: str,
        status: str,
        tags: Mapping[str, str],
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, str] | None = None,
        step: int = 0,
    ) -> None:
        self._process.call("end_trial", run_id, status, tags, metrics, params, step=step)

    def reconcile(self, parent: str, statuses: Mapping[str, str]) -> list[str]:
        return self._process.call("reconcile", parent, statuses)

    def unsent(self) -> int:
        return int(self._process.call("unsent"))


def _serve(conn: Any) -> None:
    """The child: import the tracker, then answer calls until told to end or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    start_gc.pause()  # resumed once the store is open and pandas imported (_warm)
    from .tracking import StudyTracker  # MLflow, imported while the driver imports the engine

    tracker: StudyTracker | None = None
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the driver is gone
        if message is None:
            _end(tracker)
        name, args, kwargs = message
        try:
            if name == _OPEN:
                _close_rounds(tracker)  # the study before it, in a study of methods
                tracker = StudyTracker(*args, **kwargs)
                value: Any = (tracker.uri, tracker.experiment_id)
                threading.Thread(target=_warm, daemon=True).start()
            elif name in _SERVED:
                value = getattr(tracker, name)(*args, **kwargs)
            else:
                raise AttributeError(f"StudyTracker.{name} is not served")
            reply = (True, value)
        except Exception as exc:
            if name == _OPEN:
                start_gc.resume()  # no _warm: the driver ends the study
            reply = (False, _portable(exc))
        conn.send(reply)


def _warm() -> None:
    """Import what the study's end needs (pandas: ``log_table``), while the trials run; then
    the process's start is over (:mod:`..common.start_gc`)."""
    try:
        with contextlib.suppress(Exception):
            import pandas  # noqa: F401
    finally:
        start_gc.resume()


def _close_rounds(tracker: StudyTracker | None) -> None:
    """Store what the tracker's round log has queued and stop its thread (``finish_study``
    did already, unless its study ended early); None: nothing to do."""
    if tracker is not None:
        with contextlib.suppress(Exception):
            tracker.rounds.close()


def _end(tracker: StudyTracker | None) -> None:
    """Store what is queued, then exit at once: everything is stored, and the interpreter's
    teardown of MLflow's modules would take seconds the driver waits for."""
    _close_rounds(tracker)
    os._exit(0)


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives a pickle round trip, else a ``RuntimeError`` that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
