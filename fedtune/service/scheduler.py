"""The scheduler: dispatch queued studies under a global limit, watch drivers, stop cancelled ones.

One background thread ticks every ``FEDTUNE_SCHEDULER_INTERVAL_S`` seconds (and at once when a
study is cancelled):

0. **deadline** — a running study past its deadline (``Settings.study_deadline``:
   ``FEDTUNE_STUDY_DEADLINE_S``, or its ``budget.time`` plus
   ``FEDTUNE_STUDY_DEADLINE_GRACE_S``) fails with that reason, its running trials are killed and
   its driver is stopped as a cancelled one's (step 1): whatever its code does, a study ends;
1. **stop** — drivers of studies cancelled since the last tick: ``backend.stop(ref)`` (the whole
   driver with its trials); once the driver is gone, the study's MLflow runs are marked
   ``KILLED`` (``fedtune.tuning.mlflow.client.kill_study_runs``) and, where its Optuna storage is on this machine's workdir,
   trials still queued there are dropped and trials left running there end interrupted (the
   driver does both when it stops gracefully; this covers a driver killed first);
2. **watch** — :func:`reconcile.reconcile_running`: a running study whose driver is gone, or
   whose attempt's start ticket was redeemed twice (compromised: its driver is stopped), is
   re-queued (it resumes) or failed after ``FEDTUNE_MAX_DISPATCH_ATTEMPTS``; the drivers of final
   studies are released (:func:`reconcile.release_finished`: their RayJobs deleted);
   the backend tidies up (``Backend.tidy``: the local backend reaps exited drivers);
3. **dispatch** — while fewer than ``FEDTUNE_MAX_CONCURRENT_STUDIES`` run, the studies
   :mod:`.admission` admits (project quotas, weighted fair share, priority, then submission
   time; the others keep ``queued`` with the reason they wait): claim (compare-and-set queued →
   running, attempt + 1, recording what it reserves: :func:`.project_usage.reservation`, GPUs
   per trial process, and issuing the attempt's one-time start ticket: :mod:`.tickets`), then
   ``backend.launch``. A launch the backend refuses puts the study
   back in the queue without spending an attempt, and dispatching backs off (1 s doubling to
   60 s);
4. **compare** — a study of methods whose studies have all ended gets its comparison recorded
   as an MLflow run (``comparisons.record_ended_groups``, at most one group a tick).

A backend that is unusable as a whole — its credentials refused, its address unreachable
(:mod:`.backend_health`) — is one state of the service, not an error of each study: it is logged
once when it changes, shown by ``/readyz`` and ``fedtune_backend_up``, and while it lasts no
study is claimed: each tick (under the same backoff) probes the backend (``Backend.check``) and
every queued study shows ``queued`` with the reason.

One scheduler per database: with ``leadership`` (``leader.py``: a fenced lease on PostgreSQL, a
lock file on SQLite) only the leader ticks, so several API replicas may share one database.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import select

from fedtune.errors import BackendError, FedtuneError

from . import tickets
from .admission import plan_dispatch
from .backend_health import BackendHealth
from .backends.base import Backend, LaunchRequest
from .db import Database
from .leader import Fence, Leadership
from .mlflow_workspaces import study_mlflow
from .models import DEFAULT_PROJECT, Project, utcnow
from .optuna_sync import OptunaView
from .paths import study_workdir
from .project_usage import reservation, trial_processes
from .reconcile import Recovery, reconcile_running, release_finished
from .repository import Repository
from .settings import Settings
from .states import StudyState

if TYPE_CHECKING:
    from fedtune.tuning.spec import StoredSpec

__all__ = ["Scheduler", "TickReport"]

log = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0
STOP_WAIT_S = 120.0  # how long a stopped driver may take to exit before runs are marked anyway
QUEUE_SCAN = 5000  # queued studies the admission looks at per tick (oldest first)


@dataclass
class TickReport:
    late: list[str] = field(default_factory=list)
    stopped: list[str] = field(default_factory=list)
    recovered: list[Recovery] = field(default_factory=list)
    released: list[str] = field(default_factory=list)
    dispatched: list[str] = field(default_factory=list)
    after: list[str] = field(default_factory=list)


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
        leadership: Leadership | None = None,
        before_launch: Callable[[LaunchRequest], None] | None = None,
        after_tick: Callable[[], list[str]] | None = None,
    ) -> None:
        self.db, self.backend, self.settings = db, backend, settings
        #: readies what a driver needs outside the backend (its project's MLflow workspace);
        #: a BackendError puts the study back in the queue like a failed launch
        self._before_launch = before_launch
        #: the leader's last step of each tick (the comparisons of ended studies of methods)
        self._after_tick = after_tick
        #: several replicas on one database: only the leader ticks (``leader.py``)
        self.leadership = leadership
        self.fence: Fence | None = None
        self.is_leader = leadership is None
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
        #: whether the backend can be used at all (``/readyz``, ``fedtune_backend_up``)
        self.health = BackendHealth(backend)

    # ---------------------------------------------------------------- thread

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="fedtune-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._halt.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.leadership is not None:
            with self._tick_lock:  # no tick in flight: hand the lease over at once
                self.leadership.release()
            self.is_leader = False

    @property
    def leading(self) -> bool:
        """This process's scheduler thread runs and leads (``fedtune_scheduler_leader``)."""
        return self.is_leader and self._thread is not None and self._thread.is_alive()

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
            if self.leadership is not None:
                self.fence = self.leadership.hold()
                self.is_leader = self.fence is not None
                if not self.is_leader:
                    return report  # another replica (or process) schedules this database
            self.backend.tidy()
            report.late = self._fail_late()
            report.stopped = self._process_stops()
            report.recovered = reconcile_running(
                self.db,
                self.backend,
                self.settings.max_dispatch_attempts,
                self.fence,
                health=self.health,
            )
            report.released = release_finished(self.db, self.backend)
            if self._clock() >= self._not_before:
                report.dispatched = self._dispatch()
            if self._after_tick is not None:
                report.after = self._after_tick()
            return report

    def _fail_late(self) -> list[str]:
        """Fail the running studies past their deadline and queue their drivers' stop."""
        now = utcnow()
        with self.db.session(readonly=True) as session:
            late = []
            for study in Repository(session).studies_in(StudyState.RUNNING):
                deadline = self.settings.study_deadline(study.sections.budget.time)
                started = study.started_at
                if deadline and started and (now - started).total_seconds() > deadline[0]:
                    late.append((study.id, *deadline))
        failed = []
        for study_id, limit, why in late:
            error = (
                f"the study ran past its deadline of {limit:g} s ({why}); its driver was stopped"
            )
            with self.db.session() as session:
                repo = Repository(session)
                if not repo.transition(
                    study_id,
                    StudyState.FAILED,
                    expected=[StudyState.RUNNING],
                    error=error,
                    fence=self.fence,
                ):
                    continue  # it ended meanwhile
                repo.kill_running_trials(study_id)
            log.warning("study %s: %s", study_id, error)
            self._stops.put((study_id, 0))
            failed.append(study_id)
        return failed

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
                name, project = study.name, study.project
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
                    with study_mlflow(self.settings, study_id, project) as uri:
                        self._kill_runs(uri, *mlflow, runs)
                except Exception as exc:  # MLflow down: the cancellation itself stands
                    log.warning("study %s: marking MLflow runs KILLED failed: %s", study_id, exc)

    def _drop_queue(self, study_id: str, name: str, driver_gone: bool = False) -> None:
        """No WAITING trial of a cancelled study stays in its Optuna storage,
        nor, once its driver is gone, a RUNNING one (the driver was killed before its clean-up)."""
        view = OptunaView(study_workdir(self.settings, study_id), name)
        if not view.exists():
            return  # never started here, or on a pod's disk
        try:
            view.discard_waiting(orphans=driver_gone)
        except Exception as exc:  # a locked or damaged storage: the cancellation itself stands
            log.warning("study %s: dropping queued Optuna trials failed: %s", study_id, exc)

    def _dispatch(self) -> list[str]:
        if self.health.state.up is not True and not self._backend_usable():
            return []
        # the cluster's GPUs as the backend reports them (Ray: its nodes' totals, read at most
        # every 30 s), unless the settings fix them; asked outside the database session
        capacity = None if self.settings.cluster_gpus is not None else self._capacity()
        with self.db.session(readonly=True) as session:
            repo = Repository(session)
            # each query reads an index range of live studies, never the finished history
            free = self.settings.max_concurrent_studies - repo.count_in(StudyState.RUNNING)
            waiting = repo.studies_in(StudyState.QUEUED, QUEUE_SCAN)
            if not waiting:
                return []
            queues = dict(session.execute(select(Project.name, Project.queue_name)).all())
            details = {
                s.id: (
                    s.attempts,
                    {
                        **_request_fields(s.sections),
                        "code_sha256": s.code_sha256,
                        "project": s.project or DEFAULT_PROJECT,
                        "queue": queues.get(s.project or DEFAULT_PROJECT),
                    },
                    s.queued_reason,
                    reservation(s.sections),
                )
                for s in waiting
            }
            decision = plan_dispatch(session, waiting, max(free, 0), self.settings, capacity)
        self._record_reasons(
            {sid: r for sid, r in decision.waiting.items() if details[sid][2] != r}
        )
        dispatched = []
        for study_id in decision.admit:
            attempts, fields, _, (gpus, trials) = details[study_id]
            attempt = attempts + 1
            ticket = None
            with self.db.session() as session:
                claimed = Repository(session).transition(
                    study_id,
                    StudyState.RUNNING,
                    expected=[StudyState.QUEUED],
                    attempts=attempt,
                    backend=str(self.backend.kind),
                    driver_ref=None,
                    reserved_gpus=gpus,
                    reserved_trials=trials,
                    queued_reason=None,
                    fence=self.fence,
                )
                if claimed and self.settings.drivers_report_to:  # the driver's start carries it
                    ticket = tickets.issue(
                        session, study_id, attempt, self.settings.driver_ticket_ttl_s
                    )
            if not claimed:
                continue  # cancelled meanwhile
            if not self._launch(LaunchRequest(study_id, attempt, ticket=ticket, **fields)):
                break
            dispatched.append(study_id)
        return dispatched

    def _backend_usable(self) -> bool:
        """Probe a backend not known to be up; while it is down, every queued study shows why
        it waits and dispatching backs off."""
        if self.health.probe():
            return True
        reason = self.health.queued_reason
        with self.db.session(readonly=True) as session:
            waiting = Repository(session).studies_in(StudyState.QUEUED, QUEUE_SCAN)
            stale = {s.id: reason for s in waiting if s.queued_reason != reason}
        self._record_reasons(stale)
        self._back_off()
        return False

    def _back_off(self) -> None:
        self._backoff_s = min(MAX_BACKOFF_S, max(1.0, self._backoff_s * 2))
        self._not_before = self._clock() + self._backoff_s

    def _capacity(self) -> float | None:
        try:
            return self.backend.capacity_gpus()
        except Exception as exc:  # never stop dispatching for it
            log.warning("cluster capacity unknown: %s", exc)
            return None

    def _record_reasons(self, reasons: dict[str, str]) -> None:
        """Why each queued study waits (shown by ``GET /v1/studies/{id}``), where it changed."""
        if not reasons:
            return
        with self.db.session() as session:
            repo = Repository(session)
            for study_id, reason in reasons.items():
                repo.set_queued_reason(study_id, reason)

    def _launch(self, request: LaunchRequest) -> bool:
        try:
            if self._before_launch is not None:
                self._before_launch(request)
            ref = self.backend.launch(request)
        except BackendError as exc:
            # the backend as a whole unusable: logged once by the health, shown as the reason
            unusable = self.health.failed(exc)
            if not unusable:
                log.warning(
                    "study %s: launch failed (%s); back in the queue", request.study_id, exc
                )
            why = (
                {"queued_reason": self.health.queued_reason}
                if unusable
                else {"error": f"launch failed: {exc}"}
            )
            with self.db.session() as session:
                Repository(session).transition(
                    request.study_id,
                    StudyState.QUEUED,
                    expected=[StudyState.RUNNING],
                    attempts=request.attempt - 1,
                    fence=self.fence,
                    **why,
                )
            self._back_off()
            return False
        self.health.answered()
        self._backoff_s = 0.0
        with self.db.session() as session:
            Repository(session).update_study(request.study_id, driver_ref=ref)
        return True


def _request_fields(spec: StoredSpec) -> dict:
    """The :class:`LaunchRequest` fields of a stored spec: resources per trial process.

    Args:
        spec: The typed parts of the study's stored spec (``Study.sections``).

    Returns:
        ``cpu`` and ``gpu`` (per process), ``max_concurrent`` (configurations at once) and
        ``processes`` (trial processes at once: :func:`.project_usage.trial_processes`).
    """
    return {
        "cpu": spec.resources.cpu,
        "gpu": spec.resources.gpu,
        "max_concurrent": spec.budget.max_concurrent,
        "processes": trial_processes(spec),
    }
