"""The study driver: what ``fedtune worker run-study ID`` runs, wherever the backend put it.

0. read the settings from the environment, where ``FEDTUNE_DRIVER_URL`` and
   ``FEDTUNE_DRIVER_TICKET`` (the service's API, and a one-time ticket that the driver exchanges
   for a credential of this study and attempt and its project's MLflow login, held in memory
   only: :mod:`.driver_start`; a ticket the service refuses — expired, or already redeemed,
   which marks the attempt compromised — ends the driver with exit 77) or else
   ``FEDTUNE_DATABASE_URL`` must be set
   (:func:`load_driver_settings`: every backend passes one; a driver on a cluster whose
   processes lack both must not fall back to a SQLite file in its working directory that no
   service reads): if not, exit 2 with one line naming the variable — the backend reads that
   line and, exit status 2 being permanent, fails the study without another attempt; the
   driver reads and writes its study only through that link;
   then check that ``FEDTUNE_WORKDIR`` is writable (a read-only root file system without a mounted
   workdir): if not, record that one line as the study's error (when the study is ours to run),
   and exit 2 with it;
1. load the study; exit 0 at once unless it is ``running`` and this is its current dispatch
   attempt (a superseded or cancelled driver must not run);
   A study with uploaded code fetches its package from the service (:mod:`.study_code`); on a
   shared Ray head (backend ``ray``) the driver then imports nothing and runs the rest of itself
   in a sandbox (:mod:`.head_sandbox`); code
   that does not import here fails the study with "the study's code failed to load on the
   driver's machine: <field>: <error> (at <file:line>)";
2. ``run_study(spec, <FEDTUNE_WORKDIR>/studies/<id>, sinks=[DbSink])`` — trials, rounds and
   MLflow run ids go to the service while it runs, so status and trials are always current.
   ``in_process`` unless ``FEDTUNE_TRIALS_THROUGH_RAY`` is set: a study whose trials fit the
   driver's process trains there (``placement.place``), else on an embedded Ray, and on the
   cluster's where ``RAY_ADDRESS`` is set (inside a Ray job or a RayJob it is);
3. a heartbeat thread stamps ``studies.heartbeat_at`` every ``FEDTUNE_HEARTBEAT_S`` and stops
   the driver (SIGINT to itself) when the study is cancelled or re-dispatched elsewhere;
4. at the end, synchronise trial states from the Optuna storage and write the final state with
   a compare-and-set on ``running``: ``succeeded`` (best trial, MLflow ids) or ``failed`` (the
   error; also when every finished trial failed, with the first trial's error as the reason).
   Stopped by SIGINT (the local backend, the heartbeat) or SIGTERM before Ray starts — the
   first signal only; later ones are ignored so the clean-up runs to its end —
   ``run_study`` records in-flight trials as interrupted and marks MLflow runs KILLED; the
   driver writes no state (the service decided: cancelled, or re-queued to resume) and exits
   143; for a cancelled study it first drops the trials still queued in Optuna (no ``WAITING``
   trial is left). Once Ray runs, SIGTERM (a Ray job stopped, a pod deleted) is Ray's ``sys.exit``; the
   service then marks the MLflow runs KILLED itself;
5. an error is *transient* or *permanent* (:mod:`.faults`): a transient one (Ray did not start,
   a connection lost) puts the study back in the queue after ``FEDTUNE_RETRY_BACKOFF_S ·
   2^(attempt−1)`` seconds while ``attempt < FEDTUNE_MAX_DISPATCH_ATTEMPTS`` (the scheduler
   re-dispatches it and it resumes), else fails it; a permanent one fails it at once.

Exit codes: 0 done (or nothing to do), 1 the study failed, 2 misconfigured (no
``FEDTUNE_DATABASE_URL``, an unwritable workdir), 69 a transient error: the study was re-queued,
75 another driver holds the study's lock (or the attempt was superseded), 77 the service refused
the driver's start ticket, 143 stopped.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from fedtune.errors import (
    CodeError,
    ConfigError,
    ConflictError,
    DatabaseUnavailableError,
    FedtuneError,
)

from .child_env import DRIVER_SANDBOX
from .driver_claim import Claim
from .driver_link import DriverLink, link_from_environment
from .driver_start import DriverCredentials, driver_credentials, tracking_uri_with_login
from .faults import is_database_outage, is_transient, retry_delay_s
from .head_sandbox import check_sandboxed_tracking, run_in_head_sandbox, wants_head_sandbox
from .optuna_sync import OptunaView
from .paths import check_workdir, study_tracking_uri, study_workdir
from .settings import Settings, database_url_from_env, load_settings
from .specs import load_spec
from .states import StudyState
from .study_code import with_study_code

__all__ = [
    "EXIT_LOCKED",
    "EXIT_REFUSED",
    "EXIT_REQUEUED",
    "EXIT_STOPPED",
    "Heartbeat",
    "load_driver_settings",
    "run_driver",
]

log = logging.getLogger(__name__)
EXIT_REQUEUED, EXIT_LOCKED, EXIT_REFUSED, EXIT_STOPPED = 69, 75, 77, 143


class Heartbeat(threading.Thread):
    """Stamp ``heartbeat_at``; call ``on_lost`` once the study is no longer ours to run."""

    def __init__(
        self, link: DriverLink, attempt: int, every_s: float, on_lost: Callable[[], None]
    ) -> None:
        super().__init__(name="fedtune-heartbeat", daemon=True)
        self.link, self.study_id, self.attempt, self.every_s = link, link.study_id, attempt, every_s
        self.on_lost = on_lost
        self.halt = threading.Event()
        self._lock = threading.Lock()

    def stop(self) -> None:
        """No ``on_lost`` after this returns (the lock orders it against a beat in flight)."""
        with self._lock:
            self.halt.set()
        self.join(self.every_s + 30)

    def beat(self) -> bool:
        """One heartbeat; False when the study was cancelled or re-dispatched."""
        return self.link.heartbeat(self.attempt)

    def run(self) -> None:
        while not self.halt.wait(self.every_s):
            try:
                alive = self.beat()
            except ConflictError as exc:  # its credential revoked: the attempt is no longer ours
                log.warning("heartbeat refused: %s", exc)
                alive = False
            except FedtuneError as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            if not alive:
                with self._lock:
                    if self.halt.is_set():
                        return
                    log.warning("study %s is no longer running here; stopping", self.study_id)
                    self.on_lost()
                return


class _StopOnce:
    """SIGINT and SIGTERM handler: the first signal raises ``KeyboardInterrupt``; later ones are
    logged and ignored, so the clean-up that the first one started (in-flight trials recorded as
    interrupted, MLflow runs KILLED, the queue dropped) runs to its end."""

    def __init__(self) -> None:
        self.stopping = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.stopping:
            log.info("already stopping; signal %d ignored", signum)
            return
        self.stopping = True
        raise KeyboardInterrupt


def load_driver_settings() -> Settings:
    """The driver's settings, from its environment.

    Returns:
        The settings, as the service's.

    Raises:
        ConfigError: neither ``FEDTUNE_DRIVER_URL`` with ``FEDTUNE_DRIVER_TICKET`` nor
            ``FEDTUNE_DATABASE_URL`` is set (the service's own default, a SQLite file in the
            working directory, is no database a driver may write: on a cluster no service reads
            it), or a setting is invalid.
    """
    settings = load_settings()
    has_api = settings.driver_url is not None and (
        settings.driver_ticket is not None or settings.driver_credentials_on_stdin
    )
    if not has_api and not (database_url_from_env() or "").strip():
        raise ConfigError(
            "FEDTUNE_DATABASE_URL",
            "not set in the driver's environment, nor FEDTUNE_DRIVER_URL and "
            "FEDTUNE_DRIVER_TICKET; give the driver the service's URL and its start ticket, or "
            "the cluster's processes the service database's URL (the driver never falls back "
            "to a SQLite file)",
        )
    return settings


def _claim(link: DriverLink, attempt: int | None) -> Claim | None:
    claim = link.claim()
    if claim.state != StudyState.RUNNING:
        log.warning("study %s is %s; nothing to do", link.study_id, claim.state)
        return None
    if attempt is not None and claim.attempts != attempt:
        log.warning("study %s: attempt %s superseded by %s", link.study_id, attempt, claim.attempts)
        return None
    return claim


def _restart_if_storage_lost(link: DriverLink, view: OptunaView) -> None:
    """Trials recorded but no Optuna storage (a fresh pod): the study starts over, cleanly."""
    if view.exists():
        return
    dropped = link.reset_trials()
    if dropped:
        log.warning(
            "study %s: Optuna storage %s missing; %d recorded trial(s) dropped, "
            "the study starts over",
            link.study_id,
            view.path,
            dropped,
        )


def _finish(link: DriverLink, state: StudyState, **values: Any) -> None:
    if not link.finish(state, **values):
        log.warning("study %s changed state meanwhile; %s not recorded", link.study_id, state)


def _sync(link: DriverLink, view: OptunaView) -> None:
    """Every finished trial of the Optuna storage recorded by the service."""
    fixed = link.apply_finished_trials(view.finished())
    if fixed:
        log.info("study %s: %d trial(s) synchronised from the Optuna storage", link.study_id, fixed)


def run_driver(
    study_id: str,
    settings: Settings,
    attempt: int | None = None,
    *,
    run_study: Callable[..., Any] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    link: DriverLink | None = None,
) -> int:
    """Run study ``study_id`` to its end (see the module docstring); returns the exit code.
    ``sleep`` waits out the backoff before a transient error re-queues the study; ``link``
    (default: the one the environment names, with the credentials its start ticket is
    exchanged for: ``driver_start``, ``driver_link.link_from_environment``) is how the driver
    reads and records its study."""
    credentials: DriverCredentials | None = None
    if link is None:
        try:
            credentials = driver_credentials(study_id, settings)
        except ConflictError as exc:  # expired, unknown, or redeemed before: not ours to run
            log.error("study %s: %s", study_id, exc)
            return EXIT_REFUSED
        if credentials is not None and attempt is not None and credentials.attempt != attempt:
            log.error("study %s: the start ticket is of attempt %d", study_id, credentials.attempt)
            return EXIT_REFUSED
        link = link_from_environment(study_id, settings, credentials)
    # The Ray processes the driver starts (an embedded cluster's raylet, agents and trial
    # workers) inherit its environment: keep the database URL and the spent ticket out of it
    # (the link and ``credentials`` hold what the driver needs, in memory).
    for name in ("FEDTUNE_DATABASE_URL", "FEDTUNE_DRIVER_TICKET"):
        os.environ.pop(name, None)
    try:
        try:
            check_workdir(settings)
        except ConfigError as exc:
            if _claim(link, attempt) is not None:
                _finish(link, StudyState.FAILED, error=str(exc))
            raise
        claimed = _claim(link, attempt)
        if claimed is None:
            return 0
        workdir = study_workdir(settings, study_id)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            document = with_study_code(link, settings, claimed.spec, claimed.code_sha256)
            if wants_head_sandbox(settings, claimed.code_sha256):  # imports nothing here
                return run_in_head_sandbox(
                    settings, study_id, claimed.attempts, document, credentials
                )
            if settings.sandboxed:
                check_sandboxed_tracking(settings, study_id)
            spec = load_spec(document)
        except ConfigError as exc:
            what = "invalid stored spec"
            if isinstance(exc, CodeError):  # the service's check imported it, this machine not
                what = "the study's code failed to load on the driver's machine"
            elif exc.field in ("code", "code.path", "MLFLOW_TRACKING_URI", DRIVER_SANDBOX):
                what = "the study's driver cannot run here"  # no sandbox, a shared file store
            log.error("study %s failed: %s: %s", study_id, what, exc)
            _finish(link, StudyState.FAILED, error=f"{what}: {exc}")
            return 1
        view = OptunaView(workdir, spec.name)
        _restart_if_storage_lost(link, view)
        login = credentials.mlflow if credentials is not None else None
        uri = tracking_uri_with_login(study_tracking_uri(settings, study_id), login)
        if run_study is None:  # here, not above: a driver handing over to its head sandbox
            from fedtune.tuning.driver.study import run_study  # never imports Optuna, NumPy

        code = _drive(link, claimed, settings, spec, (workdir, uri), view, run_study)
        if isinstance(code, BaseException):  # a transient error: back in the queue, or failed
            return _retry_later(link, claimed.attempts, settings, code, sleep)
        return code
    finally:
        link.close()


def _drive(link, claimed, settings, spec, where, view, run_study) -> int | Exception:
    """Run the study (``where``: its workdir and tracking URI, the MLflow login in it)."""
    from .sink import DbSink, TrialRecorder  # imported in the driver only

    attempts = claimed.attempts
    study_id = link.study_id
    workdir, uri = where
    mlflow_ids = _MlflowIds(link, view, uri)
    sink = DbSink(TrialRecorder(link), run_id_of=mlflow_ids.trial_run)
    heartbeat = Heartbeat(
        link, attempts, settings.heartbeat_s, lambda: os.kill(os.getpid(), signal.SIGINT)
    )
    stop = _StopOnce()
    previous = signal.signal(signal.SIGTERM, stop)
    # SIGINT must raise KeyboardInterrupt even when the driver was started with it ignored
    # (background jobs of a non-interactive shell inherit SIG_IGN) — but only once: a cancel
    # stops the driver twice (the backend's SIGINT and the heartbeat's), and a second
    # KeyboardInterrupt inside the clean-up would leave its in-flight trials RUNNING
    previous_int = signal.signal(signal.SIGINT, stop)
    heartbeat.start()
    try:
        try:
            result = run_study(
                spec,
                workdir,
                trials=settings.study_trials(spec.budget.trials),  # as the study row says
                tracking_uri=uri,
                ray_address=settings.ray_address,
                sinks=[sink],
                run_user=claimed.owner,  # MLflow's "Created by": the member who submitted it
                in_process=not settings.trials_through_ray,  # Ray only where the work needs it
            )
        finally:
            heartbeat.stop()  # before any final write, and before the handlers are restored
            sink.flush()  # the rounds it gathered, however the study ended
    except KeyboardInterrupt:
        log.warning("study %s: driver stopped", study_id)
        _sync(link, view)
        _drop_queue_if_cancelled(link, view)
        return EXIT_STOPPED
    except ConflictError as exc:
        log.error("study %s: %s", study_id, exc)
        return EXIT_LOCKED
    except Exception as exc:
        if is_database_outage(exc):  # nothing to write now: the next dispatch syncs and resumes
            log.warning("study %s: the service database failed: %s", study_id, _one_line(exc))
            return exc
        _sync(link, view)
        if is_transient(exc):
            log.warning("study %s: transient error: %s", study_id, _one_line(exc))
            return exc
        log.exception("study %s failed", study_id)
        _finish(link, StudyState.FAILED, error=_one_line(exc))
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)
    try:
        return _record_end(link, view, result)
    except DatabaseUnavailableError as exc:  # the next dispatch finds the study done and ends it
        log.warning("study %s: the service database failed at the end: %s", study_id, exc)
        return exc


def _record_end(link: DriverLink, view: OptunaView, result: Any) -> int:
    """The finished study's trials and final state, recorded by the service."""
    study_id = link.study_id
    _sync(link, view)
    best = result.best or {}
    if result.failure:  # no best configuration (all diverged, failed, stopped): failed, why
        reason = result.failure
        _finish(
            link,
            StudyState.FAILED,
            error=reason[:2000],
            mlflow_experiment_id=result.experiment_id,
            mlflow_run_id=result.parent_run_id,
        )
        log.error("study %s failed: %s", study_id, reason)
        return 1
    _finish(
        link,
        StudyState.SUCCEEDED,
        error=None,
        best_trial=best.get("number"),
        best_value=_finite(best.get("value")),
        mlflow_experiment_id=result.experiment_id,
        mlflow_run_id=result.parent_run_id,
    )
    log.info("study %s succeeded (%d trials)", study_id, result.finished)
    return 0


def _drop_queue_if_cancelled(link: DriverLink, view: OptunaView) -> None:
    """A cancelled study leaves no WAITING trial in its Optuna storage."""
    if link.is_cancelled() and (dropped := view.discard_waiting()):
        log.info("study %s cancelled: %d queued trial(s) dropped", link.study_id, dropped)


def _retry_later(link, attempt, settings, exc, sleep) -> int:
    """Re-queue the study after the backoff (attempts left) or fail it (the last one); after a
    database outage, once the database answers again, without using up the attempt."""
    study_id, reason = link.study_id, _one_line(exc)
    if is_database_outage(exc):
        if not _wait_for_database(link, settings, sleep):
            return EXIT_STOPPED
        action = link.recover(attempt, reason, counts=False)
        return EXIT_REQUEUED if action == "requeued" else 1
    if attempt < settings.max_dispatch_attempts:
        delay = retry_delay_s(settings.retry_backoff_s, attempt)
        log.warning("study %s: re-queued in %.0f s", study_id, delay)
        try:
            sleep(delay)
        except KeyboardInterrupt:  # stopped meanwhile: the service decides (module docstring)
            return EXIT_STOPPED
    action = link.recover(attempt, reason, counts=True)
    return EXIT_REQUEUED if action == "requeued" else 1


#: how long a driver waits for the service database after an outage before it gives up (the
#: service then finds the driver gone and counts the attempt: nothing is lost, the study resumes)
OUTAGE_WAIT_S = 900.0


def _wait_for_database(link, settings, sleep, limit_s: float = OUTAGE_WAIT_S) -> bool:
    """Wait (backoff, at most 30 s a step) until the service answers; False when stopped."""
    study_id = link.study_id
    delay, waited = max(settings.retry_backoff_s, 0.5), 0.0
    while True:
        try:
            link.ping()
            return True
        except DatabaseUnavailableError:
            if waited >= limit_s:
                raise
            log.warning(
                "study %s: the service database is unavailable; waiting %.0f s", study_id, delay
            )
        try:
            sleep(delay)
        except KeyboardInterrupt:
            return False
        waited += delay
        delay = min(delay * 2, 30.0)


class _MlflowIds:
    """Record the study's MLflow parent run (once) as trials start; return each trial's run.

    The parent's experiment is read from the Optuna storage, where the study recorded it with
    the run: a driver whose trials run in its process never imports MLflow (seconds of CPU) —
    its study's MLflow process does. Only a run recorded without it (a study begun by an older
    driver) is looked up in the MLflow store."""

    def __init__(self, link: DriverLink, view: OptunaView, uri: str) -> None:
        self.link, self.view, self.uri = link, view, uri
        self._parent: str | None = None

    def trial_run(self, number: int) -> str | None:
        if self._parent is None:
            self._parent, experiment = self.view.parent_run()
            if self._parent:
                experiment = experiment or self._experiment(self._parent)
                self.link.set_mlflow_ids(self._parent, experiment)
        return self.view.run_id_of(number)

    def _experiment(self, run_id: str) -> str | None:
        try:
            from fedtune.tuning.mlflow.client import run_experiment_id

            return run_experiment_id(self.uri, run_id)
        except Exception:  # the id is a convenience for links; never fail the study on it
            return None


def _finite(value: Any) -> float | None:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value == value and abs(value) != float("inf") else None


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text[:2000]
