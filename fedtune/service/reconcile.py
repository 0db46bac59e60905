"""Reconciliation: make the database agree with the drivers that actually run.

A study is ``running`` in the database while its driver works. When the backend says that
driver is no longer alive and the study is still ``running`` (the driver died without writing
its final state: ``kill -9``, a lost node, a deleted RayJob, a restart of the service that had
it as a child), the study is *recovered*: its in-flight trials are marked ``killed`` and the study
goes back to ``queued``; the scheduler dispatches it again and ``run_study`` resumes from its
Optuna storage — finished trials are kept, interrupted ones re-run under new trial numbers, so
nothing is lost or counted twice. After ``FEDTUNE_MAX_DISPATCH_ATTEMPTS`` dispatches the study
fails instead — and at once when the driver's exit status is a permanent one
(:func:`.faults.permanent_exit`: a configuration error, a command not found), since another
dispatch would end the same way. The driver's own last error line (``Backend.exit_info``: the
Ray job's log, the local driver's log, the RayJob's message) is part of the recorded reason.

A running study whose current attempt was marked compromised (its one-time start ticket was
redeemed twice: :mod:`.tickets`) has its driver stopped, on every tick until the backend says it
is gone, and is then recovered the same way, with that reason: the next dispatch is a new
attempt with a new ticket.

The reason recorded names how the driver ended and, where the backend knows it, why
(``Backend.describe``: e.g. a RayJob's ``PreRunningDeadlineExceeded: ...``). A re-queued study's
old driver is stopped (its RayJob deleted) before the new attempt replaces the reference; a
final study's driver object is deleted by :func:`release_finished` (``Backend.release``).

The service runs :func:`reconcile_running` once at start and the scheduler on every tick. Every
write is a compare-and-set on ``state = running``, so a driver that finishes at the same moment
wins and nothing is overwritten.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from fedtune.errors import BackendError

from . import tickets
from .backend_health import BackendHealth
from .backends.base import Backend, DriverExit, DriverStatus
from .db import Database
from .faults import permanent_exit
from .repository import Repository
from .states import StudyState

__all__ = ["Recovery", "reconcile_running", "recover_study", "release_finished"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recovery:
    study_id: str
    action: str  # requeued | failed | skipped (lost a race with the driver)
    reason: str


def recover_study(
    db: Database,
    study_id: str,
    attempts: int,
    reason: str,
    max_attempts: int,
    *,
    counts: bool = True,
    fence: Any = None,
    permanent: str | None = None,
) -> Recovery:
    """A running study whose driver is gone: re-queue it (resume) or fail it after the limit.
    With ``counts=False`` (a database outage: the service's fault, not the study's) it is
    re-queued and the attempt is given back: the next dispatch runs attempt ``attempts`` again.
    With ``permanent`` (why another attempt would end the same way) it fails at once."""
    with db.session() as session:
        repo = Repository(session)
        if not counts:
            note = f"{reason}; re-dispatching (attempt {attempts} again: not counted)"
            if not repo.transition(
                study_id,
                StudyState.QUEUED,
                expected=[StudyState.RUNNING],
                error=note,
                attempts=max(0, attempts - 1),
                fence=fence,
            ):
                return Recovery(study_id, "skipped", "the study is no longer running")
            repo.kill_running_trials(study_id)
            log.warning("study %s requeued: %s", study_id, note)
            return Recovery(study_id, "requeued", note)
        if permanent:
            note = f"{reason}; not retried ({permanent})"
            target, action = StudyState.FAILED, StudyState.FAILED.value
        elif attempts < max_attempts:
            note = f"{reason}; re-dispatching (attempt {attempts + 1} of {max_attempts})"
            target, action = StudyState.QUEUED, "requeued"
        else:
            note = f"{reason}; gave up after {attempts} attempts"
            target, action = StudyState.FAILED, StudyState.FAILED.value
        if not repo.transition(
            study_id, target, expected=[StudyState.RUNNING], error=note, fence=fence
        ):
            return Recovery(study_id, "skipped", "the study is no longer running")
        repo.kill_running_trials(study_id)
    log.warning("study %s %s: %s", study_id, action, note)
    return Recovery(study_id, action, note)


def reconcile_running(
    db: Database,
    backend: Backend,
    max_attempts: int,
    fence: Any = None,
    health: BackendHealth | None = None,
) -> list[Recovery]:
    """Poll the driver of every running study and recover those whose driver is gone
    (``fence``: the scheduler leader's, see ``leader.py``; ``health``: told whether the backend
    answered, so that a backend down is logged once, not once per study and tick)."""
    with db.session(readonly=True) as session:
        running = [
            (
                s.id,
                s.backend,
                dict(s.driver_ref) if s.driver_ref else None,
                s.attempts,
                s.queued_reason,
            )
            for s in Repository(session).studies_in(StudyState.RUNNING)
        ]
        compromised = set(tickets.compromised_running(session)) if running else set()
    done = []
    for study_id, kind, ref, attempts, held in running:
        if kind != str(backend.kind):
            reason = f"was running on backend {kind!r}; this service uses {backend.kind!r}"
            done.append(
                recover_study(db, study_id, max_attempts, reason, max_attempts, fence=fence)
            )
            continue
        if ref is None:
            reason = "dispatched but never launched"
            done.append(recover_study(db, study_id, attempts, reason, max_attempts, fence=fence))
            continue
        try:
            status = backend.poll(ref)
        except BackendError as exc:
            if health is None or not health.failed(exc):
                log.warning("study %s: cannot poll its driver (%s); will retry", study_id, exc)
            continue
        if health is not None:
            health.answered()
        if (study_id, attempts) in compromised:
            if status.alive:  # stopped first: the next attempt must not meet it in the storage
                _stop_quietly(backend, study_id, ref)
                continue
            reason = (
                f"attempt {attempts}'s start ticket was redeemed twice (compromised): its "
                "driver was stopped and its credential revoked"
            )
            done.append(recover_study(db, study_id, attempts, reason, max_attempts, fence=fence))
            continue
        if status.alive:  # a queue outside fedtune (Kueue) may hold it: say why, or no more
            reason = backend.waiting(ref) if status == DriverStatus.PENDING else None
            if reason != held:
                with db.session() as session:
                    Repository(session).update_study(study_id, queued_reason=reason)
            continue
        end = _exit_info(backend, study_id, ref) if status == DriverStatus.FAILED else DriverExit()
        code = f", exit code {end.code}" if end.code is not None else ""
        reason = f"driver {'exited' if status != DriverStatus.GONE else 'is gone'} ({status}{code})"
        why = backend.describe(ref)
        if end.last_line and end.last_line not in (why or ""):
            why = f"{why}: {end.last_line}" if why else end.last_line
        recovery = recover_study(
            db,
            study_id,
            attempts,
            f"{reason}: {why}" if why else reason,
            max_attempts,
            fence=fence,
            permanent=permanent_exit(end.code),
        )
        done.append(recovery)
        if recovery.action == "requeued" and status != DriverStatus.GONE:
            _stop_quietly(backend, study_id, ref)  # the next attempt replaces the reference
    return done


def _exit_info(backend: Backend, study_id: str, ref: dict) -> DriverExit:
    """``backend.exit_info(ref)``; nothing known when the backend cannot tell now."""
    try:
        return backend.exit_info(ref)
    except BackendError as exc:
        log.warning("study %s: how its driver ended is unknown (%s)", study_id, exc)
        return DriverExit()


def _stop_quietly(backend: Backend, study_id: str, ref: dict) -> None:
    try:
        backend.stop(ref)
    except BackendError as exc:
        log.warning("study %s: removing its old driver failed (%s)", study_id, exc)


def release_finished(db: Database, backend: Backend, limit: int = 50) -> list[str]:
    """``Backend.release`` the drivers of final studies (kept objects: RayJobs); clear each
    ``driver_ref`` released. Returns the study ids released."""
    if not backend.keeps_finished:
        return []
    with db.session(readonly=True) as session:
        pending = Repository(session).finished_with_driver(str(backend.kind), limit)
    released = []
    for study_id, ref in pending:
        try:
            if ref and not backend.release(ref):
                continue
        except BackendError as exc:
            log.warning("study %s: releasing its driver failed (%s); will retry", study_id, exc)
            continue
        with db.session() as session:
            Repository(session).clear_driver_ref(study_id)
        released.append(study_id)
    return released
