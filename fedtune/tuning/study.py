"""Run one study end to end: Optuna storage + Ray Tune + MLflow + the measured trade-off.

``run_study(spec, workdir)`` (ARCHITECTURE.md §4):

1. open (or create) the Optuna study in its RDB storage and *reconcile* it: trials left RUNNING
   by a driver that died are marked interrupted and re-enqueued, their MLflow runs KILLED
   (:mod:`.optuna_glue`, :mod:`.tracking`); only ``target − finished`` trials are run;
2. start Ray embedded (or connect to ``ray_address``) with the study's ``code`` in the job's
   ``runtime_env`` (:mod:`.code_shipping`: every node's workers get it from Ray), check that
   the cluster can hold one trial's CPUs/GPUs at all (fail fast instead of pending forever),
   and run a ``Tuner`` with
   :class:`~.optuna_glue.FedtuneSearch`, the scheduler (ASHA / median / none — the only
   early-stopping authority), ``tune.with_resources`` and ``max_concurrent_trials``;
3. the driver's Tune callbacks log every reported result to MLflow and the progress line;
4. at the end (also when nothing was left to run) the trade-off of every finished trial is
   computed from the storage, written as PNG/JSON/CSV, logged on the parent run with summary
   metrics, and returned with the best configuration and the Pareto set.

Start-up (issue 14 req. 3, ``benchmarks/startup.py``): the stores are opened by threads while
the driver starts Ray (or waits for the Ray ``fedtune tune`` began before its imports,
:class:`.ray_session.EarlyRay`) — a new study's Optuna storage, then its MLflow store (created
as a copy of an empty one, :mod:`.sqlite_template`) and parent run, which may still be opening
while Tune sets up and the first trial's worker starts: the MLflow callback waits for it at the
first trial's start. An existing study's storage is opened first (Ray starts only when trials
remain), its MLflow store by a thread. Spec errors (budget, sampler) fail before either.
MLflow, matplotlib and the theory report are imported where used, not at import.

Embedded Ray keeps its session files in ``<workdir>/ray`` when that path is at most
:data:`RAY_TEMP_MAX` characters long; Ray puts unix sockets ~65 characters below its temp dir
and Linux limits socket paths to 107 bytes, so a longer workdir gets
``/tmp/fedtune-ray-<hash of workdir>`` instead (:mod:`.ray_runtime`). Ray Tune's own experiment
state goes to ``<workdir>/ray_results``. Ray start-up is retried (:func:`.ray_runtime.start_ray`,
then ``RayStartError``); before it, the Ray processes a killed earlier driver of this study left
in that temp dir are reaped. Ray is shut down afterwards unless the caller had it running, and
the ``/tmp/fedtune-ray-*`` dir is removed, also when the study failed.
One driver per study: ``<workdir>/.lock`` (``flock``, released by the kernel even on kill -9).
Ctrl-C stops the study at once (Tune's graceful SIGINT handler is disabled); in-flight trials
are recorded as interrupted and re-run by the next invocation.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, MedianStoppingRule

from fedtune.errors import ConfigError
from fedtune.trainers import parse_trial_config

from . import optuna_glue as og
from . import timeline
from .code_shipping import code_runtime_env, worker_spec
from .failures import FirstErrorCallback, all_failed, first_error, no_best_reason
from .preflight import preflight
from .ray_runtime import RAY_TEMP_MAX, ray_temp_dir
from .ray_session import EarlyRay
from .ray_session import ray_session as _ray_session
from .ray_session import study_lock as _study_lock
from .spec import SchedulerName, StudySpec
from .store import StudyStore
from .tradeoff import TOP_TRIALS, TradeOff
from .tradeoff_scheduler import TradeoffScheduler
from .tradeoff_search import PrunerStop, TradeoffState, stopper_for
from .trainable import OBJECTIVE, ROUND, TRIAL_KEY, make_trainable

if TYPE_CHECKING:
    from .tracking import StudyTracker

# MLflow (.tracking), matplotlib (.plots) and the theory report are imported where used: MLflow
# by the thread that opens the tracking store while Ray starts (run_study), so neither is paid
# before Ray's start begins.

__all__ = ["RAY_TEMP_MAX", "StudyResult", "check_resources", "ray_temp_dir", "run_study"]

_TUNE_ENV = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",  # the storage and MLflow are the record
    "TUNE_DISABLE_SIGINT_HANDLER": "1",  # Ctrl-C raises KeyboardInterrupt at once
    "RAY_AIR_NEW_OUTPUT": "0",  # its experiment header prints even with verbose=0
}


@dataclass
class StudyResult:
    """What a study produced (JSON-ready through :meth:`to_dict`)."""

    name: str
    workdir: str
    storage_url: str
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    target_trials: int
    finished: int
    ran: int
    counts: dict[str, int]
    best: dict[str, Any] | None
    pareto: list[dict[str, Any]]
    tradeoff: dict[str, Any] | None
    artifacts: dict[str, str]
    interrupted: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    #: stopped trials by reason (``optuna_glue.stop_reasons``: ``worse``, ``rung``, ``asha`` …)
    stop_reasons: dict[str, int] = field(default_factory=dict)
    #: ``trial N: <error>`` of the first failed trial (``failures.first_error``), if any
    first_error: str | None = None
    #: why there is no best configuration (``failures.no_best_reason``); None when there is one.
    #: The one rule: a study with a failure ends failed (CLI exit 1, service state ``failed``)
    failure: str | None = None

    @property
    def all_failed(self) -> bool:
        """Trials finished and every one of them failed (the study did not succeed)."""
        return all_failed(self.counts)

    @property
    def commands(self) -> dict[str, str]:
        from .tracking import executable, ui_command, ui_url

        return {
            "mlflow_ui": ui_command(self.tracking_uri),
            "mlflow_page": ui_url(self.tracking_uri, self.experiment_id),
            "optuna_dashboard": f"{executable('optuna-dashboard')} {self.storage_url}",
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ±∞ and NaN (a diverged value, a never-reached target) become null."""
        return _json_safe({**self.__dict__, "commands": self.commands})


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def run_study(
    spec: StudySpec,
    workdir: str | Path,
    *,
    tracking_uri: str | None = None,
    ray_address: str | None = None,
    trials: int | None = None,
    progress: TextIO | None = None,
    sinks: Sequence[Any] = (),
    early: EarlyRay | None = None,
) -> StudyResult:
    """Run (or resume, or extend to ``trials`` in total) the study ``spec`` under ``workdir``.

    ``progress``: a stream for the live progress line (e.g. ``sys.stderr``). ``sinks``: extra
    Ray Tune callbacks run in the driver (each trial's config carries its Optuna trial number
    under ``fedtune.trial``). ``early``: the study's lock and embedded Ray, already starting
    (:class:`.ray_session.EarlyRay`, begun by ``fedtune tune`` before its imports); used unless
    the study needs another Ray (``ray_address``, code shipped in a ``runtime_env``), and
    closed here. Raises ``ConfigError`` (bad spec, incompatible stored study, resources the
    cluster lacks) and ``ConflictError`` (another driver runs the study).
    """
    t0 = time.perf_counter()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    timeline.mark("run_study")
    if early is not None and early.workdir != workdir:
        early.close()  # begun for another directory: not this study's lock
        early = None
    lock = contextlib.closing(early.claim()) if early is not None else _study_lock(workdir)
    with lock:
        with contextlib.ExitStack() as stack:
            # the stores are opened by threads while Ray starts, MLflow's until the first trial
            # starts (start-up, issue 14 req. 3)
            pool = stack.enter_context(ThreadPoolExecutor(3, "fedtune-stores"))
            session: _Session | None = None
            opened: Future | None = None
            shipped = False
            if _stored(workdir):  # resumed or extended: Ray if trials remain
                session = _Session.open(spec, workdir, trials, t0)
                timeline.mark("optuna_opened")
                session.track(pool, tracking_uri)
                start = session.remaining > 0
            else:  # a new study runs trials: its stores are created while Ray starts
                _Session.check(spec, trials)
                opened = pool.submit(_Session.create, spec, workdir, trials, t0, tracking_uri, pool)
                start = True
            if start:  # the task and model built once, as a trial would, while Ray starts
                checked = pool.submit(preflight, spec)
                try:
                    env = code_runtime_env(spec, workdir)
                    if early is not None and not env and not ray_address:
                        shipped = early.ready()
                        # Ray shuts down in its thread while the report is written; the lock's
                        # close (after finalize) waits for it (issue 21 req. 3)
                        stack.callback(early.request_stop)
                    else:
                        if early is not None:
                            early.stop_ray()  # this study needs a Ray of its own
                        shipped = stack.enter_context(_ray_session(workdir, ray_address, env))
                    check_resources(spec, ray.cluster_resources())
                    checked.result()  # its ConfigError is the study's: no trial runs
                except BaseException as exc:
                    _fail_opened(opened, session, exc)
                    raise
                timeline.mark("ray_started")
            session = opened.result() if opened is not None else session
            assert session is not None
            session.shipped = shipped
            session.raise_if_tracking_failed()  # known already: before any trial runs
            timeline.mark("session_ready")
            if session.remaining:
                session.fit(progress, sinks)
        return session.finalize()


@dataclass
class _Session:
    """One invocation of a study: its storage, target, tracking and timings."""

    spec: StudySpec
    workdir: Path
    space: Any
    store: StudyStore
    study: Any
    target: int
    fixed: og.Reconciled
    t0: float
    tracker: StudyTracker | None = None
    parent: str = ""
    tracking: Future | None = None  # open_tracking in a thread (see track)
    first_start: float | None = None
    shipped: bool = False  # the code reaches the trials through the job's runtime_env
    fit_s: float = 0.0

    @property
    def remaining(self) -> int:
        return max(0, self.target - self.fixed.finished)

    @staticmethod
    def check(spec: StudySpec, trials: int | None) -> int:
        """The target number of trials; fails fast (e.g. cmaes not installed) before Ray."""
        target = og.target_trials(spec, spec.search_space(), trials)
        og.make_sampler(spec, target)
        return target

    @classmethod
    def create(
        cls,
        spec: StudySpec,
        workdir: Path,
        trials: int | None,
        t0: float,
        uri: str | None,
        pool: ThreadPoolExecutor,
    ) -> _Session:
        """A new study's session with its Optuna study (run in a thread of ``pool``), its MLflow
        experiment opening in another (:meth:`track`)."""
        session = cls.open(spec, workdir, trials, t0)
        timeline.mark("optuna_opened")
        session.track(pool, uri)
        return session

    @classmethod
    def open(cls, spec: StudySpec, workdir: Path, trials: int | None, t0: float) -> _Session:
        space = spec.search_space()
        target = cls.check(spec, trials)
        storage = og.make_storage(og.storage_url(workdir))
        study = og.open_study(spec, storage, space)
        store = StudyStore(storage, spec.name)
        if spec.sampler_name == "grid":
            og.enqueue_grid(study, space)
        fixed = og.reconcile(study, store)
        return cls(spec, workdir, space, store, study, target, fixed, t0)

    def __getstate__(self) -> dict[str, Any]:
        """Tune pickles its callbacks (which hold the session) into its experiment state; the
        thread's future does not pickle and a restored copy has no use for it."""
        return {**self.__dict__, "tracking": None}

    def track(self, pool: ThreadPoolExecutor, uri: str | None) -> None:
        """Open the MLflow store and parent run in a thread of ``pool``: the driver goes on to
        Tune's set-up and the first trial's worker start meanwhile; what needs MLflow waits
        (:meth:`wait_tracking`, the MLflow callback at the first trial's start)."""
        self.tracking = pool.submit(self.open_tracking, uri)

    def wait_tracking(self) -> None:
        """Until the tracking store is open; re-raises the error that prevented it."""
        if self.tracking is not None:
            self.tracking.result()

    def raise_if_tracking_failed(self) -> None:
        """The tracking store's error, if it has already failed (nothing is waited for)."""
        if self.tracking is not None and self.tracking.done():
            self.tracking.result()

    def tracking_opened(self) -> bool:
        """Wait for the tracking store; False when it failed to open (the error is raised
        where the caller has nothing else to raise)."""
        try:
            self.wait_tracking()
        except Exception:
            return False
        return self.tracker is not None and bool(self.parent)

    def open_tracking(self, explicit_uri: str | None) -> None:
        """The study's MLflow experiment (store created if new) and parent run (created, or the
        resumed study's), its child runs reconciled; also imports what the fit needs — a thread
        does it while Ray starts. The figures' matplotlib is imported once the first trial
        runs (:func:`_import_plots`), not in this CPU-bound start-up."""
        from . import progress  # noqa: F401 — imported here, off the critical path
        from .tracking import StudyTracker, resolve_tracking_uri

        spec, workdir = self.spec, self.workdir
        uri = resolve_tracking_uri(workdir, explicit_uri, spec.tracking.uri)
        local = uri.startswith("sqlite:") or "://" not in uri
        root = (workdir / "mlartifacts").as_uri() if local else None
        self.tracker = StudyTracker(uri, spec.experiment, root)
        space_doc = {**self.space.to_dict(), "fingerprint": self.space.fingerprint()}
        previous = self.store.parent_run_id()
        self.parent = self.tracker.start_study(spec, space_doc, previous)
        self.store.set_parent_run_id(self.parent)
        self.tracker.reconcile(self.parent, og.run_statuses(self.study))
        timeline.mark("mlflow_opened")

    def fit(self, progress: TextIO | None, sinks: Sequence[Any]) -> None:
        start = time.perf_counter()
        try:
            with _tune_environment():
                tuner = _tuner(self, self._callbacks(progress, sinks))
                timeline.mark("fit")
                tuner.fit()
                timeline.mark("fit_done")
            self.wait_tracking()  # a fit without trials never asked for it
            # a wall-clock budget ends the fit with trials in flight: record them as
            # interrupted (re-run by the next invocation), exactly as after a Ctrl-C
            if og.reconcile(self.study, self.store).interrupted:
                self.tracker.reconcile(self.parent, og.run_statuses(self.study))
        except BaseException as exc:  # Ctrl-C or a driver error: in-flight trials re-run later
            og.reconcile(self.study, self.store)
            if not self.tracking_opened():  # the tracking store's error is the study's
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self.wait_tracking()
            self.tracker.reconcile(self.parent, og.run_statuses(self.study))
            status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
            self.tracker.finish_study(self.parent, {}, status)
            raise
        finally:
            self.fit_s = time.perf_counter() - start

    def _callbacks(self, progress: TextIO | None, sinks: Sequence[Any]) -> list[Any]:
        from .progress import ProgressCallback

        session = self

        class FirstStart(tune.Callback):
            def on_trial_start(self, iteration, trials, trial, **info):
                if session.first_start is None:
                    timeline.mark("first_trial_scheduled")
                    _import_plots()
                session.first_start = session.first_start or time.perf_counter()

        out = [FirstStart(), FirstErrorCallback(self.study), _AfterTracking(self)]
        if progress is not None:
            best = og.best_trial(self.spec, self.study, self.space)
            counts = og.study_counts(self.study)
            shown = {k: v for k, v in counts.items() if k not in ("trials", "interrupted")}
            out.append(ProgressCallback(
                progress, self.spec.name, self.target, self.fixed.finished,
                (best["value"], best["number"]) if best else None, shown,
                self.spec.objective.directions[0],
            ))  # fmt: skip
        return [*out, *sinks]

    def _remember(self, number: int, run_id: str) -> None:
        """Store the child run id on the Optuna trial (resume finds its MLflow run)."""
        self.store.set_run_id(number, run_id)

    def finalize(self) -> StudyResult:
        self.wait_tracking()
        start = time.perf_counter()
        timeline.mark("finalize")
        spec, study, tracker = self.spec, self.study, self.tracker
        counts = og.study_counts(study)
        best = og.best_trial(spec, study, self.space)
        report = tradeoff_report(
            spec, og.study_curves(self.store, self.space), self.workdir / "tradeoff"
        )
        timeline.mark("report_written")
        finished = og.count_finished(study)
        metrics = {f"n_{k}": float(v) for k, v in counts.items()}
        if best is not None:
            metrics.update({f"best_{k}": v for k, v in best["values"].items()})
        if report.envelope:
            tracker.log_series(self.parent, "envelope_loss", report.envelope)
        tracker.log_json(self.parent, {"best": best, "pareto": report.pareto}, "best.json")
        best_run = self.store.run_id_of(best["number"]) if best is not None else None
        tracker.mark_best(self.parent, best_run, best["number"] if best else None)
        minimize = str(spec.objective.directions[0]) == "min"
        table, note = summary_table(self.store, report.analysis, self.space, minimize,
                                    best["number"] if best is not None else None)  # fmt: skip
        if table["number"]:
            tracker.log_table(self.parent, table, "trials_table.json", note)
        tracker.finish_study(self.parent, metrics, "FINISHED", report.directory, "tradeoff",
                             step=finished)  # fmt: skip
        now = time.perf_counter()
        timeline.mark("finalized")
        startup = (self.first_start or start) - self.t0
        timings = {"startup_s": startup, "tuning_s": self.fit_s, "finalize_s": now - start,
                   "total_s": now - self.t0}  # fmt: skip
        return StudyResult(
            name=spec.name, workdir=str(self.workdir), storage_url=og.storage_url(self.workdir),
            tracking_uri=tracker.uri, experiment_id=tracker.experiment_id,
            parent_run_id=self.parent, target_trials=self.target, finished=finished,
            ran=finished - self.fixed.finished, counts=counts, best=best,
            pareto=report.pareto, tradeoff=report.tradeoff,
            artifacts={k: str(v) for k, v in report.files.items()},
            interrupted=list(self.fixed.interrupted), timings=timings,
            stop_reasons=og.stop_reasons(study, spec.scheduler_name and str(spec.scheduler_name)),
            first_error=first_error(study),
            failure=None if best is not None else no_best_reason(study, counts),
        )  # fmt: skip


def _tuner(session: _Session, callbacks: list[Any]) -> tune.Tuner:
    spec = session.spec
    rounds = parse_trial_config(spec.base_trial_config()).train.rounds
    offset = len(session.study.get_trials(deepcopy=False))  # a resumed sampler draws anew
    sampler = og.make_sampler(spec, session.target, offset=offset)
    state = _tradeoff_state(spec, session, rounds)
    searcher = og.FedtuneSearch(spec, session.space, session.store, sampler, state)
    resources = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    return tune.Tuner(
        tune.with_resources(make_trainable(worker_spec(spec) if session.shipped else spec),
                            resources),
        tune_config=tune.TuneConfig(
            search_alg=searcher, scheduler=_scheduler(spec, rounds, state),
            num_samples=session.remaining, max_concurrent_trials=spec.budget.max_concurrent,
            time_budget_s=spec.budget.wall_clock_s, reuse_actors=True,
            trial_name_creator=_trial_name, trial_dirname_creator=_trial_name,
        ),
        run_config=tune.RunConfig(
            name=time.strftime("session-%Y%m%d-%H%M%S"),
            storage_path=str(session.workdir / "ray_results"), callbacks=callbacks,
            verbose=0, failure_config=tune.FailureConfig(max_failures=0),
        ),
    )  # fmt: skip


def _trial_name(trial: Any) -> str:
    return f"trial-{int(trial.config[TRIAL_KEY]):04d}"


def _tradeoff_state(
    spec: StudySpec, session: _Session, rounds: int
) -> TradeoffState | PrunerStop | None:
    """The strategy's own stop rule: tradeoff's sweep + stop rule (with a resumed study's sweep
    so far) or hyperband's pruner (``tradeoff_search.stopper_for``)."""
    state = stopper_for(spec, session.space, rounds)
    if isinstance(state, TradeoffState):
        state.seed_history(og.sweep_history(session.study))
    return state


def _scheduler(
    spec: StudySpec, rounds: int, state: TradeoffState | PrunerStop | None = None
) -> Any:
    s, mode = spec.scheduler, str(spec.objective.directions[0])
    if state is not None:
        return TradeoffScheduler(state)
    name = spec.scheduler_name
    common = {"time_attr": ROUND, "metric": OBJECTIVE, "mode": mode, "grace_period": s.grace_rounds}
    if name == SchedulerName.ASHA:
        return ASHAScheduler(max_t=rounds, reduction_factor=s.reduction_factor, **common)
    if name == SchedulerName.MEDIAN:
        return MedianStoppingRule(min_samples_required=3, **common)
    return FIFOScheduler()


def _import_plots() -> None:
    """Import the figures' module (matplotlib, ~0.6 s of CPU) in a thread: the end of the
    study needs it, the start-up (Ray, the first trial's worker) should not wait for it."""
    import importlib
    import threading

    threading.Thread(target=importlib.import_module, args=(f"{__package__}.plots",),
                     name="fedtune-import-plots", daemon=True).start()  # fmt: skip


# -- the trade-off ----------------------------------------------------------------------
@dataclass
class _Report:
    tradeoff: dict[str, Any] | None = None  # tradeoff.json's content (its listed trials)
    pareto: list[dict[str, Any]] = field(default_factory=list)
    envelope: list[tuple[int, float]] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)
    directory: Path | None = None
    analysis: TradeOff | None = None  # every trial's summary


def tradeoff_report(spec: StudySpec, curves: list, directory: Path) -> _Report:
    """Trade-off of the finished trials (``tradeoff.py``), its files, Pareto rows and E(R)."""
    if not curves:
        return _Report()
    from .plots import write_artifacts
    from .report import tradeoff_of
    from .theory_link import theory_report

    document = spec.to_dict()
    rounds = parse_trial_config(spec.base_trial_config()).train.rounds
    t = tradeoff_of({**document, "train": {**document["train"], "rounds": rounds}}, curves)
    files = write_artifacts(t, curves, directory, color_by=next(iter(curves[0].params), None))
    k = t.targets.index(t.pareto_target) if t.pareto_target is not None else 0
    pareto = [
        {"number": s.trial_id, "rounds_to_target": s.rounds_to_target[k],
         "final_loss": s.final_loss, "params": dict(s.params)}
        for s in map(t.summary_of, t.pareto)
    ]  # fmt: skip
    envelope = [(p.round, p.loss) for p in t.envelope if math.isfinite(p.loss)]
    named = set(t.shown())  # a large study: its best trials, Pareto set and envelope
    files.update(theory_report(spec, [c for c in curves if c.trial_id in named], directory))
    return _Report(t.to_dict(), pareto, envelope, files, directory, t)


def summary_table(
    store: StudyStore,
    analysis: TradeOff | None,
    space: Any,
    minimize: bool = True,
    best: int | None = None,
    top: int = TOP_TRIALS,
) -> tuple[dict[str, list], str]:
    """The MLflow table ``trials_table.json`` and a line saying what it lists: one row per
    finished trial — number, rank (1 = best objective), outcome, params, objective, rounds
    reached, rounds to the Pareto target, flag, on the Pareto set, decays — for every trial of
    a study of at most ``top``; beyond, the ``top`` best objectives, the Pareto set and the
    best trial ``best`` (issue 21 req. 4: bounded at any number of trials)."""
    from fedtune.search_spaces import resolve_values

    summaries = {s.trial_id: s for s in analysis.trials} if analysis is not None else {}
    pareto = set(analysis.pareto) if analysis is not None else set()
    k = None
    if analysis is not None and analysis.pareto_target is not None:
        k = analysis.targets.index(analysis.pareto_target)
    trials = [t for t in store.trials() if t.state.is_finished()]

    def objective(t: Any) -> float | None:
        value = t.values[0] if t.values else None
        return value if value is not None and math.isfinite(value) else None

    valued = [t for t in trials if objective(t) is not None]
    ranked = sorted(valued, key=lambda t: (objective(t) * (1 if minimize else -1), t.number))
    rank = {t.number: i for i, t in enumerate(ranked, 1)}
    listed = trials
    note = f"all {len(trials)} finished trials"
    if len(trials) > top:
        keep = {t.number for t in ranked[:top]} | pareto | ({best} if best is not None else set())
        listed = [t for t in trials if t.number in keep]
        note = (f"{len(listed)} of {len(trials)} finished trials: the {top} best objectives, "
                "the Pareto set and the best trial")  # fmt: skip
    keys = sorted({p for t in listed for p in t.params})
    cols: dict[str, list] = {c: [] for c in ("number", "rank", "outcome", "objective", "rounds",
                                              "rounds_to_target", "flag", "on_pareto",
                                              "decays")}  # fmt: skip
    cols.update({f"param.{p}": [] for p in keys})
    for t in sorted(listed, key=lambda t: t.number):
        summary = summaries.get(t.number)
        rtt = summary.rounds_to_target[k] if summary is not None and k is not None else None
        cols["number"].append(t.number)
        cols["rank"].append(rank.get(t.number))
        cols["outcome"].append(og.outcome_of(t))
        cols["objective"].append(objective(t))
        cols["rounds"].append(t.user_attrs.get("rounds"))
        cols["rounds_to_target"].append(rtt if rtt is not None and math.isfinite(rtt) else None)
        cols["flag"].append(summary.flag if summary is not None else "")
        cols["on_pareto"].append(t.number in pareto)
        cols["decays"].append(t.user_attrs.get("decays"))
        params = resolve_values(space, t.params) if t.params else {}
        for p in keys:
            value = params.get(p)
            cols[f"param.{p}"].append(value if value is None else str(value))
    return cols, note


# -- process plumbing: lock, Ray, Tune's environment ----------------------------------
def _fail_opened(opened: Future | None, session: _Session | None, exc: BaseException) -> None:
    """Ray did not start (or lacks the resources): the parent run that the stores' threads
    opened meanwhile ends as after a failed fit (KILLED after Ctrl-C, else FAILED)."""
    status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
    with contextlib.suppress(Exception):
        session = opened.result() if opened is not None else session
        if session is not None and session.tracking_opened():
            session.tracker.finish_study(session.parent, {}, status)


class _AfterTracking(tune.Callback):
    """The MLflow callback (:class:`.tracking.MlflowCallback`), built at its first event once
    the tracking store is open — it opens in a thread while Tune sets up and the first trial's
    worker process starts, so neither waits for MLflow (start-up, issue 14 req. 3). Its
    import of MLflow happens there too. A store that failed to open raises its error here."""

    def __init__(self, session: _Session) -> None:
        self._session = session
        self._inner: Any = None

    def _callback(self) -> Any:
        if self._inner is None:
            from .tracking import MlflowCallback

            s = self._session
            s.wait_tracking()
            self._inner = MlflowCallback(s.tracker, s.parent, s.spec, s._remember)
        return self._inner

    def on_trial_start(self, *args: Any, **kwargs: Any) -> None:
        self._callback().on_trial_start(*args, **kwargs)

    def on_trial_result(self, *args: Any, **kwargs: Any) -> None:
        self._callback().on_trial_result(*args, **kwargs)

    def on_trial_complete(self, *args: Any, **kwargs: Any) -> None:
        self._callback().on_trial_complete(*args, **kwargs)

    def on_trial_error(self, *args: Any, **kwargs: Any) -> None:
        self._callback().on_trial_error(*args, **kwargs)


def _stored(workdir: Path) -> bool:
    """The study's Optuna storage exists (a resume or an extension, not a new study)."""
    return Path(og.storage_url(workdir).removeprefix("sqlite:///")).is_file()


def check_resources(spec: StudySpec, cluster: dict[str, float]) -> None:
    """Fail fast when one trial's CPUs/GPUs exceed what the whole Ray cluster has."""
    have = {"cpu": cluster.get("CPU", 0.0), "gpu": cluster.get("GPU", 0.0)}
    for key in ("cpu", "gpu"):
        want = getattr(spec.resources, key)
        if want > have[key]:
            raise ConfigError(
                f"resources.{key}",
                f"each trial asks for {want:g} {key.upper()}(s) but the Ray cluster has "
                f"{have[key]:g} (CPU {have['cpu']:g}, GPU {have['gpu']:g}); "
                "lower resources or use a cluster with them (--ray-address)",
            )


@contextlib.contextmanager
def _tune_environment() -> Iterator[None]:
    """Tune settings read from the environment at ``fit`` time, restored afterwards."""
    saved = {k: os.environ.get(k) for k in _TUNE_ENV}
    os.environ.update(_TUNE_ENV)
    tune_log = logging.getLogger("ray.tune")
    level = tune_log.level
    tune_log.setLevel(logging.CRITICAL)  # trial errors are reported by our callbacks
    try:
        yield
    finally:
        tune_log.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
