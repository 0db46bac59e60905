"""The scheduler: dispatch queued studies under a global limit, watch drivers, stop cancelled ones.

One background thread ticks every ``FEDTUNE_SCHEDULER_INTERVAL_S`` seconds (and at once when a
study is cancelled):

1. **stop** — drivers of studies cancelled since the last tick: ``backend.stop(ref)`` (the whole
   driver with its trials); once the driver is gone, the study's MLflow runs are marked
   ``KILLED`` (``tracking.kill_runs``) and, where its Optuna storage is on this machine's workdir,
   trials still queued there are dropped and trials left running there end interrupted (the
   driver does both when it stops gracefully; this covers a driver killed first);
2. **watch** — :func:`reconcile.reconcile_running`: a running study whose driver is gone is
   re-queued (it resumes) or failed after ``FEDTUNE_MAX_DISPATCH_ATTEMPTS``; the drivers of final
   studies are released (:func:`reconcile.release_finished`: their RayJobs deleted);
3. **dispatch** — oldest queued studies first, while fewer than
   ``FEDTUNE_MAX_CONCURRENT_STUDIES`` run: claim (compare-and-set queued → running, attempt + 1),
   then ``backend.launch``. A launch the backend refuses puts the study back in the queue
   without spending an attempt, and dispatching backs off (1 s doubling to 60 s).

One scheduler per database: run one API replica (the Helm chart's default), since the global
limit is counted, not locked.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fedtune.errors import BackendError, FedtuneError

from .backends.base import Backend, LaunchRequest
from .db import Database
from .optuna_sync import OptunaView
from .paths import study_tracking_uri, study_workdir
from .reconcile import Recovery, reconcile_running, release_finished
from .repository import Repository
from .settings import Settings
from .states import StudyState

__all__ = ["Scheduler", "TickReport"]

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0
STOP_WAIT_S = 120.0  # how long a stopped driver may take to exit before runs are marked anyway


@dataclass
class TickReport:
    stopped: list[str] = field(default_factory=list)
    recovered: list[Recovery] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    dispatched: list[str] = field(default_factory=list)


KillRuns = Callable[[str | None, str | None, str | None, list[str]], object]


class Scheduler:
    def __init__(
        self,
        db: Database,
        backend: Backend,
        settings: Settings,
        *,
        kill_runs: KillRuns | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db, self.backend, self.settings = db, backend, settings
        self._kill_runs = kill_runs
        self._clock = clock
        self._stops: queue.SimpleQueue[tuple[str, int]] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._backoff_s = 0.0
        self._not_before = 0.0
        self._tick_lock = threading.Lock()
        self._stopping: dict[str, float] = {}  # cancelled study -> deadline for its driver

    # ---------------------------------------------------------------- thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fedtune-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def request_stop(self, study_id: str) -> None:
        """Stop a cancelled study's driver on the next tick (called by ``cancel_study``)."""
        self._stops.put((study_id, 0))
        self._wake.set()

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                self.tick()
            except FedtuneError as exc:  # database unavailable, ...: try again next tick
                log.warning("scheduler tick failed: %s", exc)
            except Exception:
                log.exception("scheduler tick failed")
            self._wake.wait(self.settings.scheduler_interval_s)
            self._wake.clear()

    # ---------------------------------------------------------------- one tick

    def tick(self) -> TickReport:
        with self._tick_lock:
            report = TickReport()
            report.stopped = self._process_stops()
            report.recovered = reconcile_running(
                self.db, self.backend, self.settings.max_dispatch_attempts
            )
            report.released = release_finished(self.db, self.backend)
            if self._clock() >= self._not_before:
                report.dispatched = self._dispatch()
            return report

    def _process_stops(self) -> list[str]:
        """Signal the drivers of newly cancelled studies; finish those whose driver is gone."""
        stopped, retry = [], []
        while True:
            try:
                study_id, tries = self._stops.get_nowait()
            except queue.Empty:
                break
            try:
                self._signal_stop(study_id)
            except FedtuneError as exc:
                log.warning("study %s: stopping its driver failed (%s)", study_id, exc)
                if tries < 10:
                    retry.append((study_id, tries + 1))
                continue
            stopped.append(study_id)
            self._stopping[study_id] = self._clock() + STOP_WAIT_S
        for item in retry:
            self._stops.put(item)
        self._finish_stops()
        return stopped

    def _signal_stop(self, study_id: str) -> None:
        with self.db.session(readonly=True) as session:
            study = Repository(session).require_study(study_id)
            ref, kind = study.driver_ref, study.backend
        if ref and kind == str(self.backend.kind):
            self.backend.stop(ref)

    def _finish_stops(self) -> None:
        """Once a stopped driver is gone (or after ``STOP_WAIT_S``), mark its MLflow runs
        KILLED: the driver may itself have ended them as FAILED (SIGTERM under Ray)."""
        for study_id, deadline in list(self._stopping.items()):
            with self.db.session(readonly=True) as session:
                repo = Repository(session)
                study = repo.require_study(study_id)
                ref, kind = study.driver_ref, study.backend
                mlflow = (study.mlflow_experiment_id, study.mlflow_run_id)
                name = study.name
                runs = [t.mlflow_run_id for t in repo.list_trials(study_id) if t.mlflow_run_id]
            gone = False  # known to have exited: nothing of it can still write the storage
            if ref and kind == str(self.backend.kind):
                try:
                    gone = not self.backend.poll(ref).alive
                except BackendError:
                    gone = False
                if not gone and self._clock() < deadline:
                    continue
            del self._stopping[study_id]
            self._drop_queue(study_id, name, gone)
            if self._kill_runs is not None and (mlflow[1] or runs):
                try:
                    self._kill_runs(study_tracking_uri(self.settings, study_id), *mlflow, runs)
                except Exception as exc:  # MLflow down: the cancellation itself stands
                    log.warning("study %s: marking MLflow runs KILLED failed: %s", study_id, exc)

    def _drop_queue(self, study_id: str, name: str, driver_gone: bool = False) -> None:
        """No WAITING trial of a cancelled study stays in its Optuna storage (issue 15 item 4),
        nor, once its driver is gone, a RUNNING one (the driver was killed before its clean-up)."""
        view = OptunaView(study_workdir(self.settings, study_id), name)
        if not view.exists():
            return  # never started here, or on a pod's disk
        try:
            view.discard_waiting(orphans=driver_gone)
        except Exception as exc:  # a locked or damaged storage: the cancellation itself stands
            log.warning("study %s: dropping queued Optuna trials failed: %s", study_id, exc)

    def _dispatch(self) -> list[str]:
        with self.db.session(readonly=True) as session:
            repo = Repository(session)
            free = self.settings.max_concurrent_studies - repo.count_by_state()[StudyState.RUNNING]
            if free <= 0:
                return []
            queued = [
                (s.id, s.attempts, {**_request_fields(s.spec), "code_sha256": s.code_sha256})
                for s in repo.studies_in(StudyState.QUEUED, free)
            ]
        dispatched = []
        for study_id, attempts, fields in queued:
            attempt = attempts + 1
            with self.db.session() as session:
                claimed = Repository(session).transition(
                    study_id,
                    StudyState.RUNNING,
                    expected=[StudyState.QUEUED],
                    attempts=attempt,
                    backend=str(self.backend.kind),
                    driver_ref=None,
                )
            if not claimed:
                continue  # cancelled meanwhile
            if not self._launch(LaunchRequest(study_id, attempt, **fields)):
                break
            dispatched.append(study_id)
        return dispatched

    def _launch(self, request: LaunchRequest) -> bool:
        try:
            ref = self.backend.launch(request)
        except BackendError as exc:
            log.warning("study %s: launch failed (%s); back in the queue", request.study_id, exc)
            with self.db.session() as session:
                Repository(session).transition(
                    request.study_id,
                    StudyState.QUEUED,
                    expected=[StudyState.RUNNING],
                    attempts=request.attempt - 1,
                    error=f"launch failed: {exc}",
                )
            self._backoff_s = min(MAX_BACKOFF_S, max(1.0, self._backoff_s * 2))
            self._not_before = self._clock() + self._backoff_s
            return False
        self._backoff_s = 0.0
        with self.db.session() as session:
            Repository(session).update_study(request.study_id, driver_ref=ref)
        return True


def _request_fields(spec: dict) -> dict:
    resources, budget = spec.get("resources") or {}, spec.get("budget") or {}
    return {
        "cpu": float(resources.get("cpu") or 1.0),
        "gpu": float(resources.get("gpu") or 0.0),
        "max_concurrent": int(budget.get("max_concurrent") or 1),
    }
