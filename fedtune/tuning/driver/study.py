"""Run one study end to end: Optuna storage + Ray Tune + MLflow + the measured trade-off.

:func:`run_study` takes the study's lock, then runs four phases
(``docs/explanation/architecture.md §4``), each a function over the frozen
:class:`StudyPlan`:

1. **prepare** (:func:`_prepare`): the target number of trials and whether the study is
   stored already; spec errors (budget, sampler) fail here, before Ray and the stores;
2. **start the runtime** (:func:`_start_runtime`): open the Optuna storage and *reconcile*
   it (trials left RUNNING by a driver that died are marked interrupted and re-enqueued, their
   MLflow runs KILLED: :mod:`fedtune.tuning.optuna.search`, :mod:`.tracking`), open the MLflow store and
   parent run, and start Ray (or take the one :class:`.ray_session.EarlyRay` began, or connect
   to ``ray_address``) with the study's ``code`` in the job's ``runtime_env``
   (:mod:`.code_shipping`), the task and model built once (:mod:`.preflight`) and the
   cluster's resources checked; what runs concurrently runs in one :class:`.startup.Startup`.
   A stored study is opened first, and Ray starts only when trials remain. The preflight is
   begun first, and its error ends the study as soon as it is known: what has not begun does
   not begin, and Ray's start is stopped (:mod:`.ray_thread`);
3. **fit** (:func:`.fit.fit`): a ``Tuner`` runs the ``target − finished`` remaining
   configurations in packs of P ≥ 1 per trial process (:mod:`..packing`), asked of
   :class:`~fedtune.tuning.optuna.searcher.FedtuneSearch`; they are stopped early by the study's one stopper
   (:func:`.stoppers.stopper_for`), asked by :class:`.schedulers.PackScheduler` after every
   report; the driver's callbacks log every configuration's results to MLflow and the
   progress line;
4. **finalize** (:func:`.ending.finalize`): the trade-off of every finished trial, computed from the
   storage, written as PNG/JSON/CSV, logged on the parent run with summary metrics, and
   returned with the best configuration and the Pareto set.

A failure anywhere in 2–3 ends the parent run once, in :func:`_start_runtime` (KILLED after
Ctrl-C, else FAILED); trials in flight are recorded as interrupted and re-run by the next
invocation. Ray is shut down afterwards unless the caller had it running (embedded Ray's
files: :mod:`.ray_runtime`). One driver per study: ``<workdir>/.lock``. Ctrl-C stops the
study at once (Tune's graceful SIGINT handler is disabled). MLflow, matplotlib and the
theory report are imported where used, not at import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from fedtune.errors import ConfigError
from fedtune.redact import strip_credentials

from ..common import timeline
from ..optuna import search as og
from ..optuna.store import StudyStore
from ..spec import StudySpec
from .code_shipping import code_runtime_env
from .ending import ended as end_read
from .ending import finalize
from .phases import Fitted, Runtime, Stores, StudyPlan, StudyResult, Tracking
from .placement import place
from .preflight import preflight
from .ray_runtime import RAY_TEMP_MAX, ray_temp_dir
from .ray_session import EarlyRay
from .ray_session import ray_session as _ray_session
from .ray_session import study_lock as _study_lock
from .ray_thread import RayStartAborted, RayThread
from .startup import Deferred, Startup

if TYPE_CHECKING:
    from ..mlflow.process import TrackerProcess
    from ..mlflow.tracker import Tracker

# MLflow (.tracking), matplotlib (.plots) and the theory report are imported where used: MLflow
# by the thread that opens the tracking store while Ray starts, so neither is paid before
# Ray's start begins.

__all__ = [
    "RAY_TEMP_MAX",
    "StudyPlan",
    "StudyResult",
    "check_resources",
    "ray_temp_dir",
    "run_study",
]

log = logging.getLogger(__name__)


# -- run_study and its phases -----------------------------------------------------------
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
    in_process: bool = False,
    tracking_process: TrackerProcess | None = None,
    keep_tracking_process: bool = False,
    run_user: str | None = None,
) -> StudyResult:
    """Run (or resume, or extend to ``trials`` in total) the study ``spec`` under ``workdir``.

    Args:
        spec: The study.
        workdir: Its directory (created if missing).
        tracking_uri: The MLflow store (None: the spec's, else ``<workdir>/mlflow.db``).
        ray_address: A Ray cluster to run on (None: the caller's Ray, else an embedded one).
        trials: The number of finished trials to reach (None: the spec's budget).
        progress: A stream for the live progress line (e.g. ``sys.stderr``).
        sinks: Extra callbacks run in the driver, each a :class:`~..tune_hooks.Callback` (Ray
            Tune's hooks without Ray; a Ray Tune ``Callback`` does too, as only its hooks are
            called, but imports Ray). Each sees every configuration as a
            trial: its config carries its Optuna trial number under ``fedtune.trial``, and its
            results hold fedtune's fields and Tune's ``pid``, ``hostname``, ``node_ip`` and
            ``timestamp`` (not Tune's iteration counters, which are its pack's).
        early: The study's lock and embedded Ray, already starting (begun by ``fedtune tune``
            before its imports); used unless the study needs another Ray (``ray_address``,
            code shipped in a ``runtime_env``) or none, and closed here.
        in_process: Run the trials in this process, without Ray, when they fit it — on the
            CPU, one configuration at a time or all of them in one pack, as the spec asks or
            where that is estimated to cost less than Ray — and no Ray cluster is named
            (``ray_address``, ``RAY_ADDRESS``) or already running here (the choice:
            :func:`.placement.place`; the tuner: :mod:`.in_process`).
        tracking_process: The MLflow store's process, already starting (begun by ``fedtune
            tune`` before its imports, :mod:`..mlflow.process`); a study whose trials run in
            this process uses it (or starts its own), and closes it here.
        keep_tracking_process: Leave ``tracking_process`` open: the caller closes it, after
            giving it to the next study (a study of methods: one MLflow import for all).
        run_user: Whom the study's MLflow runs name as their user (the ``mlflow.user`` tag,
            MLflow's "Created by"): a service's driver gives the study's owner. None: no user
            is recorded.

    Returns:
        The study's result.

    Raises:
        ConfigError: A bad spec, an incompatible stored study, resources the cluster lacks.
        ConflictError: Another driver runs the study.
    """
    t0 = time.perf_counter()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    timeline.mark("run_study")
    with _claim(workdir, early) as early:
        plan, opened = _prepare(
            spec, workdir, trials, t0, tracking_uri, ray_address, in_process, run_user
        )
        ended = end_read(plan, opened)  # a finished study, run again: its summary only
        if ended is not None:
            if tracking_process is not None and not keep_tracking_process:
                tracking_process.close()
            return ended
        with _tracker_process(plan, tracking_process, keep_tracking_process) as process:
            with _start_runtime(plan, early, process, opened) as runtime:
                fitted = _fit(plan, runtime, progress, sinks)
            return finalize(plan, fitted)


def _fit(
    plan: StudyPlan, runtime: Runtime, progress: TextIO | None, sinks: Sequence[Any]
) -> Fitted:
    """:func:`.fit.fit` (its arguments and result), imported only when trials remain: its module
    imports the trials' engine (PyTorch, seconds of CPU), which a finished study's re-run does
    without (what it returns then is :func:`.fit.fit`'s own answer for no trial left)."""
    if runtime.stores.remaining == 0:
        return Fitted(runtime.stores, runtime.tracking.result())
    from .fit import fit

    return fit(plan, runtime, progress, sinks)


@contextlib.contextmanager
def _tracker_process(
    plan: StudyPlan, given: TrackerProcess | None, keep: bool = False
) -> Iterator[Any]:
    """The MLflow store's process of a study whose trials run in this process, closed after.

    Args:
        plan: The study's plan.
        given: The process the caller began (closed at once when the study's trials run
            elsewhere: such a driver keeps its tracker in a thread).
        keep: Leave ``given`` open, whatever the study did (its caller closes it).

    Returns:
        A context that yields the process, or None.
    """
    if not plan.in_process:
        if given is not None and not keep:
            given.close()
        yield None
        return
    from ..mlflow.process import TrackerProcess

    try:
        process = given if given is not None else TrackerProcess()
    except OSError as exc:  # no process to spare: the tracker lives in this one
        log.warning("the MLflow store stays in the driver's process: %s", exc)
        yield None
        return
    try:
        yield process
    finally:
        if not (keep and process is given):
            process.close()


@contextlib.contextmanager
def _claim(workdir: Path, early: EarlyRay | None) -> Iterator[EarlyRay | None]:
    """Hold the study's lock: the one ``early`` took, else the study's own.

    Args:
        workdir: The study's directory.
        early: The early Ray (closed at once when begun for another directory).

    Returns:
        A context that yields ``early`` when it is this study's, else None.
    """
    if early is not None and early.workdir != workdir:
        early.close()  # begun for another directory: not this study's lock
        early = None
    if early is None:
        with _study_lock(workdir):
            yield None
    else:
        with contextlib.closing(early.claim()):
            yield early  # closing waits for Ray's shutdown, then releases the lock


def _prepare(
    spec: StudySpec,
    workdir: Path,
    trials: int | None,
    t0: float,
    tracking_uri: str | None = None,
    ray_address: str | None = None,
    in_process: bool = False,
    run_user: str | None = None,
) -> tuple[StudyPlan, Stores | None]:
    """Decide what this invocation of the study is; fail on spec errors before anything starts.

    A stored study is opened here, before its trials' placement is chosen: a study with no
    trial left (a re-run of a finished one) weighs nothing (the cost's measurement builds the
    task and times it) and starts nothing.

    Args:
        spec: The study.
        workdir: Its directory (resolved, locked).
        trials: The number of finished trials to reach (None: the spec's budget).
        t0: When :func:`run_study` began.
        tracking_uri: The caller's MLflow store, if any.
        ray_address: The caller's Ray cluster, if any.
        in_process: The caller lets trials that fit this process run in it.
        run_user: Whom the study's MLflow runs name as their user.

    Returns:
        The plan the other phases follow, and the stored study's open storage (None: a new
        study, whose storage is created once the preflight has passed).

    Raises:
        ConfigError: A bad budget or a sampler that cannot be made (e.g. not installed).
    """
    space = spec.search_space()
    target = og.target_trials(spec, space, trials)
    og.make_sampler(spec, og.planned_trials(spec, target))
    stored = Path(og.storage_url(workdir).removeprefix("sqlite:///")).is_file()
    uri = tracking_uri or spec.tracking.uri  # the spec's, credentials and all, kept here only
    plan = StudyPlan(
        _without_credentials(spec), workdir, space, target, stored, uri, ray_address, t0,
        run_user=run_user,
    )  # fmt: skip
    opened = _open_stores(plan) if stored else None
    if opened is not None and opened.remaining == 0:
        return plan, opened  # nothing left to run: nothing to place
    # the one choice; by cost, it times the task here (its code loaded, as the trials load it)
    here = place(spec, allowed=in_process, ray_address=ray_address, target=target)
    return dataclasses.replace(plan, placement=here), opened


def _without_credentials(spec: StudySpec) -> StudySpec:
    """``spec`` with its tracking URI stripped of user, password and query.

    What the study records and hands on — Tune's experiment state, the trainable, the Optuna
    storage, MLflow — holds this spec; only the driver's :class:`StudyPlan` holds the URI.

    Args:
        spec: The study as given.

    Returns:
        ``spec`` itself when its tracking URI carries no credential, else a copy without.
    """
    uri = spec.tracking.uri
    if uri is None or strip_credentials(uri) == uri:
        return spec
    tracking = spec.tracking.model_copy(update={"uri": strip_credentials(uri)})
    return spec.model_copy(update={"tracking": tracking})


@contextlib.contextmanager
def _start_runtime(
    plan: StudyPlan,
    early: EarlyRay | None,
    process: TrackerProcess | None = None,
    opened: Stores | None = None,
) -> Iterator[Runtime]:
    """Build the task once, open the stores and start Ray concurrently; end the study's runs if
    the study fails.

    The preflight (:mod:`.preflight`) is begun first. Its error ends the study as soon as it
    is known: what has not begun does not begin (the stores, the MLflow store and parent run,
    Ray), Ray's start is stopped (:mod:`.ray_thread`), and a parent run made meanwhile ends
    FAILED (``docs/explanation/architecture.md``, *A refusal stops the start-up*).

    Args:
        plan: The study's plan.
        early: The early Ray, if it is this study's.
        process: The MLflow store's process (None: the tracker lives in this process).
        opened: The stored study's storage, opened by :func:`_prepare` (None: a new study).

    Returns:
        A context that yields the runtime, then stops Ray and joins the start-up's threads.
    """
    with Startup("fedtune-stores") as startup, contextlib.ExitStack() as ray_stack:
        # a stored study was opened first: the trials left say whether anything need start
        stored = startup.known(opened) if opened is not None else None
        needed = stored.result().remaining if stored is not None else plan.target
        checked = startup.submit(preflight, plan.spec) if needed != 0 else None
        if checked is not None and early is not None:
            startup.on_error(checked, lambda _: early.abort())  # a refusal stops Ray's start
        stores = stored or startup.submit(_open_stores, plan, checked)
        tracking = startup.then(stores, _open_tracking, plan, process, checked)
        try:
            if checked is None:
                shipped = False
            elif plan.in_process:
                shipped = _check_in_process(plan, early, checked)
            else:
                shipped = _start_ray(plan, startup, early, ray_stack, checked)
            runtime = Runtime(stores.result(), tracking, shipped)
            tracking.check()  # known already: before any trial runs
            timeline.mark("session_ready")
            yield runtime
        except BaseException as exc:
            _end_failed(stores, tracking, exc)
            raise


def _start_ray(
    plan: StudyPlan,
    startup: Startup,
    early: EarlyRay | None,
    stack: contextlib.ExitStack,
    checked: Deferred[None],
) -> bool:
    """Start Ray (or take the early one) while the task is built, check the resources.

    An embedded Ray starts in a thread (:class:`.ray_thread.RayThread`), so that the
    preflight's error stops its start and is raised at once; a cluster's Ray (``ray_address``)
    or the caller's is connected to here.

    Args:
        plan: The study's plan.
        startup: Where the task and model are being built.
        early: The early Ray, if it is this study's.
        stack: Where Ray's shutdown is registered.
        checked: The preflight.

    Returns:
        Whether the study's code reaches the trials through the job's ``runtime_env``.

    Raises:
        ConfigError: The task cannot be built, or a trial needs more than the cluster has.
        RayStartError: Ray did not start.
    """
    import ray  # the Ray path only: a study whose trials run here never imports Ray

    env = code_runtime_env(plan.spec, plan.workdir)
    checked.check()  # refused already: no Ray starts
    if early is not None and (env or plan.ray_address):
        early.stop_ray()  # this study needs a Ray of its own
        early = None
    if early is None and (plan.ray_address or ray.is_initialized()):
        shipped = stack.enter_context(_ray_session(plan.workdir, plan.ray_address, env))
    else:
        starting = early or RayThread(plan.workdir, env, session=_ray_session).start()
        stack.callback(starting.stop)  # before the report: docs/explanation/architecture.md
        startup.on_error(checked, lambda _: starting.abort())
        try:
            shipped = starting.ready()
        except RayStartAborted:
            checked.result()  # the task's error, for which Ray's start was stopped
            raise
    check_resources(plan.spec, ray.cluster_resources())
    checked.result()  # its ConfigError is the study's: no trial runs
    timeline.mark("ray_started")
    return shipped


def _check_in_process(plan: StudyPlan, early: EarlyRay | None, checked: Deferred[None]) -> bool:
    """Check what a study whose trials run in this process needs (no Ray: an early one stops).

    Args:
        plan: The study's plan.
        early: The early Ray, if it is this study's.
        checked: The preflight.

    Returns:
        False: no code reaches the trials through a ``runtime_env``.

    Raises:
        ConfigError: The task cannot be built, or a trial needs more CPUs than this machine.
    """
    if early is not None:
        early.stop_ray()  # still starting: stopped, not waited for
    check_resources(plan.spec, {"CPU": float(os.cpu_count() or 1), "GPU": 0.0}, "this machine")
    checked.result()
    timeline.mark("in_process")
    return False


def _end_failed(stores: Deferred[Stores], tracking: Deferred[Tracking], exc: BaseException) -> None:
    """Record a failed or interrupted study: trials in flight re-run later, the parent run ends.

    Args:
        stores: The Optuna storage (waited for).
        tracking: The MLflow store (waited for).
        exc: What stopped the study (KeyboardInterrupt: the parent run ends KILLED, else
            FAILED).
    """
    status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
    with contextlib.suppress(Exception):  # the study's own error is the one raised
        opened = stores.result()
        with contextlib.suppress(Exception):  # trials in flight: interrupted, re-run later
            og.reconcile(opened.study, opened.store)
        done = tracking.result()
        failed: Exception | None = None
        try:
            done.tracker.reconcile(done.parent, og.run_statuses(opened.study))
        except Exception as error:  # the parent run still ends
            failed = error
        try:
            done.tracker.finish_study(done.parent, {}, status)
        except Exception as error:
            failed = failed or error
        if failed is not None:  # said on stderr, never silent: rounds may not be stored
            log.warning(
                "the study's MLflow runs were not all closed; %d metrics of its rounds are not "
                "stored: %s",
                done.tracker.unsent(),
                failed,
            )


def _open_stores(plan: StudyPlan, checked: Deferred[None] | None = None) -> Stores:
    """Open (or create) the study's Optuna storage and reconcile it.

    Args:
        plan: The study's plan.
        checked: The preflight, if begun (a study refused already creates no storage).

    Returns:
        The open storage and the trials still to run.
    """
    if checked is not None:
        checked.check()
    spec, space = plan.spec, plan.space
    storage = og.make_storage(og.storage_url(plan.workdir))
    study = og.open_study(spec, storage, space)
    store = StudyStore(storage, spec.name)
    if spec.sampler_name == "grid":
        og.enqueue_grid(study, space)
    fixed = og.reconcile(study, store)
    timeline.mark("optuna_opened")
    remaining = None if plan.target is None else max(0, plan.target - fixed.finished)
    return Stores(store, study, fixed, remaining)


def _open_tracking(
    stores: Stores,
    plan: StudyPlan,
    process: TrackerProcess | None = None,
    checked: Deferred[None] | None = None,
) -> Tracking:
    """Open the study's MLflow experiment and parent run; reconcile its child runs.

    The store is created if new, the parent run created or the resumed study's taken. Also
    imports what the fit needs (MLflow, the progress line), off the driver's main thread.

    Args:
        stores: The Optuna storage (it records the parent run's id).
        plan: The study's plan.
        process: The MLflow store's process (None: the tracker lives in this process).
        checked: The preflight, if begun: a study refused already opens no store and makes no
            parent run (it is not waited for: a correct study's run is made meanwhile).

    Returns:
        The open MLflow store and parent run.
    """
    if checked is not None:
        checked.check()
    from ..mlflow.client import resolve_tracking_uri
    from . import progress  # noqa: F401 — imported here, off the critical path

    spec, workdir = plan.spec, plan.workdir
    uri = resolve_tracking_uri(workdir, plan.tracking_uri, spec.tracking.uri)
    local = uri.startswith("sqlite:") or "://" not in uri
    root = (workdir / "mlartifacts").as_uri() if local else None
    if process is not None:
        tracker: Tracker = process.open(uri, spec.experiment, root, user=plan.run_user)
    else:
        from ..mlflow.tracking import StudyTracker

        tracker = StudyTracker(uri, spec.experiment, root, user=plan.run_user)
    space_doc = {**plan.space.to_dict(), "fingerprint": plan.space.fingerprint()}
    if checked is not None:
        checked.check()  # refused already: no run is made (a refusal after it ends it FAILED)
    parent = tracker.start_study(spec, space_doc, stores.store.parent_run_id())
    stores.store.set_parent_run_id(parent, tracker.experiment_id)
    tracker.reconcile(parent, og.run_statuses(stores.study))
    timeline.mark("mlflow_opened")
    return Tracking(tracker, parent)


# -- process plumbing: Ray's resources -------------------------------------------------
def check_resources(
    spec: StudySpec, cluster: dict[str, float], where: str = "the Ray cluster"
) -> None:
    """Fail fast when one trial's CPUs/GPUs exceed what the whole Ray cluster (or, for trials
    in the driver's process, the machine: ``where``) has."""
    have = {"cpu": cluster.get("CPU", 0.0), "gpu": cluster.get("GPU", 0.0)}
    for key in ("cpu", "gpu"):
        want = getattr(spec.resources, key)
        if want > have[key]:
            raise ConfigError(
                f"resources.{key}",
                f"each trial asks for {want:g} {key.upper()}(s) but {where} has "
                f"{have[key]:g} (CPU {have['cpu']:g}, GPU {have['gpu']:g}); "
                "lower resources or use a cluster with them (--ray-address)",
            )
