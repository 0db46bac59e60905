"""fedtune's searcher, scheduler and callbacks as Ray Tune's own classes (the Ray path only).

fedtune's parts subclass Ray-free bases (:mod:`fedtune.tuning.tune_hooks`), so a study whose
trials run in the driver's process never imports Ray. Ray Tune takes only its own classes
(``isinstance`` checks on the searcher, the scheduler and each callback), so the Ray path
(:func:`.fit.fit`) hands it these adapters, each a subclass of Ray Tune's class delegating to
the fedtune part it wraps:

* :class:`RaySearcher` (``ray.tune.search.Searcher``): the metric and mode, the search
  properties, ``suggest``, both results, ``save`` and ``restore``; the rest is Ray's own, as
  when fedtune's searchers subclassed it (``set_max_concurrency`` answers False, so Ray Tune's
  ``ConcurrencyLimiter`` limits the trials at once);
* :class:`RayScheduler` (``FIFOScheduler``): the three hooks the in-process tuner calls too
  (``on_trial_result``, ``on_trial_complete``, ``on_trial_error``); the rest — adding and
  removing trials, choosing the next one, the search properties, ``debug_string`` — is Ray's
  first-in-first-out scheduling, as when :class:`~..trials.schedulers.PackScheduler`
  subclassed it;
* :class:`RayCallback` (``ray.tune.Callback``): every hook, and its state. It declares itself a
  callback container, for which Ray Tune's own metaclass fails at import when a hook of Ray's is
  not overridden here: a hook a Ray upgrade adds cannot go unheard.

:func:`plain_trial_actors` starts Tune's trial actors without the ``runtime_env`` Ray Tune
gives every trainable by default, which costs each trial process a second ``import ray``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ray import tune
from ray.tune.schedulers import FIFOScheduler
from ray.tune.search import Searcher

from .. import tune_hooks as hooks

if TYPE_CHECKING:
    from ..trials.view import TrialView

__all__ = ["RayCallback", "RayScheduler", "RaySearcher", "for_ray_tune", "plain_trial_actors"]

#: the ``env_vars`` Ray Tune puts in every trainable actor's ``runtime_env`` (``ray.tune.
#: execution.class_cache.DEFAULT_ENV_VARS``): a switch of PyTorch Lightning, which no fedtune
#: trial runs
TUNE_DEFAULT_ENV_VARS = {"PL_DISABLE_FORK": "1"}


class RaySearcher(Searcher):
    """Ray Tune's searcher, delegating to a fedtune searcher (module docstring).

    Args:
        inner: The fedtune searcher.
    """

    def __init__(self, inner: hooks.Searcher) -> None:
        super().__init__(metric=inner.metric, mode=inner.mode)
        self.inner = inner

    @property
    def metric(self) -> str | None:
        return self.inner.metric

    @property
    def mode(self) -> str | None:
        return self.inner.mode

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return self.inner.set_search_properties(metric, mode, config, **spec)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        return self.inner.suggest(trial_id)

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self.inner.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        self.inner.on_trial_complete(trial_id, result=result, error=error)

    def save(self, checkpoint_path: str) -> None:
        self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.inner.restore(checkpoint_path)


class RayScheduler(FIFOScheduler):
    """Ray Tune's first-in-first-out scheduler, its decisions a fedtune scheduler's (module
    docstring).

    Args:
        inner: The fedtune scheduler.
    """

    def __init__(self, inner: hooks.Scheduler) -> None:
        super().__init__()
        self.inner = inner

    def on_trial_result(self, tune_controller: Any, trial: TrialView, result: dict) -> str:
        return self.inner.on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller: Any, trial: TrialView, result: dict) -> None:
        self.inner.on_trial_complete(tune_controller, trial, result)

    def on_trial_error(self, tune_controller: Any, trial: TrialView) -> None:
        self.inner.on_trial_error(tune_controller, trial)


class RayCallback(tune.Callback):
    """Ray Tune's callback, delegating every hook to a fedtune callback (module docstring).

    Args:
        inner: The fedtune callback.
    """

    IS_CALLBACK_CONTAINER = True  # Ray's metaclass: every hook of tune.Callback is here

    def __init__(self, inner: hooks.Callback) -> None:
        self.inner = inner

    def setup(self, **info: Any) -> None:
        self.inner.setup(**info)

    def on_step_begin(self, **info: Any) -> None:
        self.inner.on_step_begin(**info)

    def on_step_end(self, **info: Any) -> None:
        self.inner.on_step_end(**info)

    def on_trial_start(self, **info: Any) -> None:
        self.inner.on_trial_start(**info)

    def on_trial_restore(self, **info: Any) -> None:
        self.inner.on_trial_restore(**info)

    def on_trial_save(self, **info: Any) -> None:
        self.inner.on_trial_save(**info)

    def on_trial_result(self, **info: Any) -> None:
        self.inner.on_trial_result(**info)

    def on_trial_complete(self, **info: Any) -> None:
        self.inner.on_trial_complete(**info)

    def on_trial_recover(self, **info: Any) -> None:
        self.inner.on_trial_recover(**info)

    def on_trial_error(self, **info: Any) -> None:
        self.inner.on_trial_error(**info)

    def on_checkpoint(self, **info: Any) -> None:
        self.inner.on_checkpoint(**info)

    def on_experiment_end(self, **info: Any) -> None:
        self.inner.on_experiment_end(**info)

    def get_state(self) -> dict | None:
        return self.inner.get_state()

    def set_state(self, state: dict) -> None:
        self.inner.set_state(state)


def for_ray_tune(
    searcher: hooks.Searcher, scheduler: hooks.Scheduler, callbacks: Sequence[hooks.Callback]
) -> tuple[RaySearcher, RayScheduler, list[RayCallback]]:
    """A study's searcher, scheduler and callbacks as Ray Tune takes them.

    Args:
        searcher: The study's searcher.
        scheduler: Its scheduler.
        callbacks: Its callbacks.

    Returns:
        ``(searcher, scheduler, callbacks)``, each wrapped in its adapter.
    """
    return RaySearcher(searcher), RayScheduler(scheduler), [RayCallback(c) for c in callbacks]


@contextlib.contextmanager
def plain_trial_actors() -> Iterator[None]:
    """While it lasts, Ray Tune starts its trial actors with no ``runtime_env`` of its own.

    Ray Tune gives every trainable actor ``runtime_env={"env_vars": DEFAULT_ENV_VARS}``
    (:data:`TUNE_DEFAULT_ENV_VARS`, plus the variables it propagates from the driver's
    environment: AWS credentials, Ray Train's settings). A worker with a ``runtime_env`` is
    started through Ray's ``setup_worker.py``, a Python process that imports Ray (~1.1 s of
    CPU) only to exec the worker, which imports it again, after a request to the node's
    runtime-env agent; a worker without one is started directly. Without Tune's default, a
    trial process starts as a plain worker unless the driver's environment has one of the
    variables Tune propagates (then Tune's ``runtime_env`` is kept, as before). The job's own
    ``runtime_env`` (the study's shipped code) is untouched: it applies to every worker.

    Nothing changes when the Ray installed has other defaults than :data:`TUNE_DEFAULT_ENV_VARS`
    (a Ray upgrade that adds one keeps it). Restored on exit.
    """
    from ray.tune.execution import class_cache

    saved = getattr(class_cache, "DEFAULT_ENV_VARS", None)
    if saved != TUNE_DEFAULT_ENV_VARS:
        yield
        return
    class_cache.DEFAULT_ENV_VARS = {}
    try:
        yield
    finally:
        class_cache.DEFAULT_ENV_VARS = saved
