"""The fit phase of a study (:func:`fit`): Ray Tune's Tuner with the study's searcher,
scheduler, trainable and callbacks, in Tune's environment, or the driver's own
:class:`~.in_process.InProcessTuner` for trials in its process.

The parts are the same on both paths, each a subclass of a Ray-free base
(:mod:`~..tune_hooks`); Ray Tune gets them wrapped in its own classes (:mod:`.ray_adapters`).
Ray is imported only on the Ray path, so a study whose trials run in the driver's process never
imports it.

Every trial is a pack (:mod:`..packing`): P ≥ 1 configurations in one Ray Tune trial, each its
own Optuna trial, MLflow run and service trial. An unpacked study is one whose packs hold one
configuration each; it runs through the same searcher, scheduler, trainable and callbacks.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from fedtune.outcomes import TrialOutcome

from ..common import start_gc, timeline
from ..keys import TRIAL_KEY, trial_name
from ..optuna import search as og
from ..optuna.budget import RoundBudget
from ..optuna.searcher import FedtuneSearch
from ..packing import memory, speed
from ..packing.box import Box, LocalBox, RayBox
from ..packing.plan import plan as pack_plan
from ..spec import StudySpec
from ..trials.results import pack_name
from ..trials.schedulers import PackScheduler
from ..trials.stoppers import stopper_for
from ..trials.trainable import make_pack_trainable, train_pack
from ..trials.view import TrialView
from ..tune_hooks import Callback
from . import pack_members as pd
from .code_shipping import worker_spec
from .failures import FirstErrorCallback
from .in_process import InProcessTuner, in_process_note
from .phases import Fitted, Runtime, Stores, StudyPlan
from .startup import import_soon

if TYPE_CHECKING:
    from ray import tune

__all__ = ["fit"]

_TUNE_ENV = {
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",  # the storage and MLflow are the record
    "TUNE_DISABLE_SIGINT_HANDLER": "1",  # Ctrl-C raises KeyboardInterrupt at once
    "RAY_AIR_NEW_OUTPUT": "0",  # its experiment header prints even with verbose=0
}


def fit(plan: StudyPlan, runtime: Runtime, progress: TextIO | None, sinks: Sequence[Any]) -> Fitted:
    """Run the remaining trials with Ray Tune (nothing when none remain).

    Args:
        plan: The study's plan.
        runtime: The stores, the tracking and Ray.
        progress: A stream for the live progress line, if any.
        sinks: Extra callbacks (:class:`~..tune_hooks.Callback`).

    Returns:
        The stores, the open tracking, when the first trial started and how long the fit took.

    Raises:
        Exception: The tracking store's error when it failed to open, else the fit's.
    """
    stores = runtime.stores
    if stores.remaining == 0:
        return Fitted(stores, runtime.tracking.result())
    start = time.perf_counter()
    first = _FirstStart()
    budget = og.round_budget(plan.spec, stores.study)
    callbacks = [
        first,
        FirstErrorCallback(stores.study),
        _AfterTracking(plan.spec, runtime),
        *_progress(plan, stores, progress, budget),
        *sinks,
    ]
    try:
        with _tune_environment(ray_tune=not plan.in_process):
            tuner, packing = _tuner(plan, runtime, callbacks, budget)
            timeline.mark("fit")
            start_gc.resume()  # the start's objects frozen: the trials' are collected
            tuner.fit()
            timeline.mark("fit_done")
    except Exception:
        runtime.tracking.result()  # a tracking store that failed to open is the study's error
        raise
    tracking = runtime.tracking.result()  # a fit without trials never asked for it
    # a wall-clock budget ends the fit with trials in flight: record them as interrupted
    # (re-run by the next invocation), exactly as after a Ctrl-C
    if og.reconcile(stores.study, stores.store).interrupted:
        tracking.tracker.reconcile(tracking.parent, og.run_statuses(stores.study))
    return Fitted(stores, tracking, first.at, time.perf_counter() - start, packing)


class _FirstStart(Callback):
    """Notes when the first trial starts, and begins the figures' imports then."""

    def __init__(self) -> None:
        self.at: float | None = None

    def on_trial_start(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        if self.at is None:
            timeline.mark("first_trial_scheduled")
            import_soon("fedtune.tuning.analysis.plots")  # ~0.6 s of CPU, off the start-up
            self.at = time.perf_counter()


class _AfterTracking(Callback):
    """The MLflow callback (:class:`.callback.MlflowCallback`), built at its first event.

    It waits there for the tracking store, which opens in a thread while Tune sets up and the
    first trial's worker starts; a store that failed to open raises its error there.

    Args:
        spec: The study.
        runtime: The stores (child run ids are stored on the trials) and the tracking.
    """

    def __init__(self, spec: StudySpec, runtime: Runtime) -> None:
        self._spec = spec
        self._runtime = runtime
        self._inner: Any = None

    def _callback(self) -> Any:
        if self._inner is None:
            from ..mlflow.callback import MlflowCallback

            tracking, store = self._runtime.tracking.result(), self._runtime.stores.store
            self._inner = MlflowCallback(
                tracking.tracker, tracking.parent, self._spec, store.set_run_id
            )
        return self._inner

    def on_trial_start(self, *args: Any, **kwargs: Any) -> None:
        self._callback().on_trial_start(*args, **kwargs)

    def on_trial_result(self, *args: Any, **kwargs: Any) -> None:
        self._callback().on_trial_result(*args, **kwargs)

    def on_trial_complete(self, *args: Any, **kwargs: Any) -> None:
        self._callback().on_trial_complete(*args, **kwargs)

    def on_trial_error(self, *args: Any, **kwargs: Any) -> None:
        self._callback().on_trial_error(*args, **kwargs)


def _progress(
    plan: StudyPlan, stores: Stores, stream: TextIO | None, budget: RoundBudget | None
) -> list[Any]:
    """The progress line's callback, when there is a stream for it.

    Args:
        plan: The study's plan.
        stores: The Optuna storage (the best trial and counts so far).
        stream: Where the line goes (None: no line).
        budget: The study's budget in configuration-rounds (None: none).

    Returns:
        The callback in a list, or an empty list.
    """
    if stream is None:
        return []
    from .progress import ProgressCallback

    best = og.best_trial(plan.spec, stores.study, plan.space)
    counts = og.study_counts(stores.study)
    shown = {k: v for k, v in counts.items() if k not in ("trials", TrialOutcome.INTERRUPTED)}
    return [
        ProgressCallback(
            stream,
            plan.spec.name,
            plan.target,
            stores.fixed.finished,
            (best["value"], best["number"]) if best else None,
            shown,
            plan.spec.objective.directions[0],
            rounds=budget,
            time_s=plan.spec.budget.time,
        )
    ]


def _tuner(
    plan: StudyPlan, runtime: Runtime, callbacks: list[Any], budget: RoundBudget | None
) -> tuple[tune.Tuner | InProcessTuner, str]:
    """The study's Tuner (Ray Tune's, or the driver's own for a study whose trials run in its
    process), and how it packs configurations into trial processes (one line)."""
    spec, stores = plan.spec, runtime.stores
    rounds = spec.train.rounds
    offset = len(stores.study.get_trials(deepcopy=False))  # a resumed sampler draws anew
    sampler = og.make_sampler(spec, og.planned_trials(spec, plan.target), offset=offset)
    stopper = stopper_for(spec, plan.space, rounds, og.sweep_history(stores.study))
    num_samples = -1 if stores.remaining is None else stores.remaining  # -1: no limit
    search = (stopper, sampler, budget)
    if plan.in_process:
        size = pack_plan(spec).size  # one process: one configuration, or one pack of them all
        box: Box | None = LocalBox() if size > 1 else None
        searcher, scheduler, callbacks = _parts(plan, runtime, search, size, callbacks, box)
        tuner = InProcessTuner(
            functools.partial(train_pack, spec=spec, box=box),
            searcher,
            scheduler,
            callbacks,
            num_samples,
            spec.budget.time,
            threads=plan.placement.threads,
        )
        return tuner, in_process_note(size, plan.placement.why)
    return _ray_tuner(plan, runtime, search, num_samples, callbacks)


def _ray_tuner(
    plan: StudyPlan,
    runtime: Runtime,
    search: tuple[Any, Any, RoundBudget | None],
    num_samples: int,
    callbacks: list[Any],
) -> tuple[tune.Tuner, str]:
    """Ray Tune's Tuner for the study (:func:`_tuner`'s other half), and its packing line.

    Args:
        plan: The study's plan.
        runtime: The stores, and whether the trial processes get the study shipped.
        search: The stopper, sampler and budget.
        num_samples: The trials to run (-1: no limit).
        callbacks: The study's callbacks.

    Returns:
        The tuner, and how it packs configurations into trial processes (one line).
    """
    import ray
    from ray import tune

    from .ray_adapters import for_ray_tune

    spec = plan.spec
    shipped = worker_spec(spec) if runtime.shipped else spec  # as its trial processes get it
    packing = pack_plan(
        spec,
        ray.cluster_resources(),
        lambda: memory.measure_on_cluster(shipped),
        lambda size: speed.measure_on_cluster(shipped, size),
    )
    box = RayBox.start() if packing.size > 1 else None  # a PackBox actor
    parts = _parts(plan, runtime, search, packing.size, callbacks, box)
    searcher, scheduler, callbacks = for_ray_tune(*parts)
    resources = {"cpu": spec.resources.cpu, "gpu": spec.resources.gpu}
    name = _trial_namer(packing.size)
    tuner = tune.Tuner(
        tune.with_resources(make_pack_trainable(shipped, box), resources),
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=num_samples,
            max_concurrent_trials=packing.processes,
            time_budget_s=spec.budget.time,
            reuse_actors=True,
            trial_name_creator=name,
            trial_dirname_creator=name,
        ),
        run_config=tune.RunConfig(
            name=time.strftime("session-%Y%m%d-%H%M%S"),
            storage_path=str(plan.workdir / "ray_results"),
            callbacks=callbacks,
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    why = plan.placement.why  # a cost that chose Ray over one pack in this process
    return tuner, f"{packing.note}; through Ray: {why}" if why else packing.note


def _parts(
    plan: StudyPlan,
    runtime: Runtime,
    search: tuple[Any, Any, RoundBudget | None],
    size: int,
    callbacks: list[Any],
    box: Box | None,
) -> tuple[Any, Any, list[Any]]:
    """The searcher, scheduler and callbacks of a study (:mod:`.pack_members`).

    A study that packs (``size`` ≥ 2) has a :class:`~.packing.box.Box` (a
    :class:`~.packing.box.RayBox`, or a :class:`~.packing.box.LocalBox` for trials in the
    driver's process) through which its
    packs hear of stops and take refills; packs of one need none (the tuner stops the trial of
    a stopped configuration, and a place a configuration frees is the tuner's to refill).

    Args:
        plan: The study's plan.
        runtime: The stores.
        search: The study's stopper, its Optuna sampler and its budget in configuration-rounds
            (None: none).
        size: Configurations per pack (1: every configuration in a process of its own).
        callbacks: The study's callbacks, which see configurations.
        box: The packs' box (None: packs of one).

    Returns:
        ``(searcher, scheduler, callbacks)`` for the tuner.
    """
    spec, stores = plan.spec, runtime.stores
    stopper, sampler, budget = search
    book = pd.PackBook()
    inner = FedtuneSearch(spec, plan.space, stores.store, sampler, stopper, budget)
    key = pd.config_key(spec) if size > 1 else pd.alone
    searcher = pd.PackSearch(inner, book, size, stores.remaining, key, stores.store, box)
    return searcher, PackScheduler(stopper, book, box), [pd.PackCallback(callbacks, book)]


def _trial_namer(size: int) -> Any:
    """A trial's name and directory: ``pack-<first member's number>`` in a study that packs,
    ``trial-<number>`` when each configuration has a process of its own."""

    def name(trial: TrialView) -> str:
        number = int(trial.config[TRIAL_KEY])
        return pack_name(number) if size > 1 else trial_name(number)

    return name


@contextlib.contextmanager
def _tune_environment(*, ray_tune: bool = True) -> Iterator[None]:
    """Tune settings read from the environment at ``fit`` time, restored afterwards; with
    ``ray_tune`` (trials in Ray Tune's actors), also trial actors without Tune's default
    ``runtime_env`` (:func:`.ray_adapters.plain_trial_actors`: each starts as a plain Ray
    worker, a second ``import ray`` cheaper). Without it, Ray is not imported."""
    saved = {k: os.environ.get(k) for k in _TUNE_ENV}
    os.environ.update(_TUNE_ENV)
    tune_log = logging.getLogger("ray.tune")
    level = tune_log.level
    tune_log.setLevel(logging.CRITICAL)  # trial errors are reported by our callbacks
    try:
        if ray_tune:
            from .ray_adapters import plain_trial_actors

            with plain_trial_actors():
                yield
        else:
            yield
    finally:
        tune_log.setLevel(level)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
