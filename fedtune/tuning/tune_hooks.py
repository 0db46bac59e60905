"""Ray Tune's hooks without Ray: the bases of fedtune's searchers, scheduler and callbacks, and
the names of the fields Ray Tune adds to every result.

fedtune's searchers (:class:`~.optuna.searcher.FedtuneSearch`,
:class:`~.driver.pack_members.PackSearch`), its scheduler
(:class:`~.trials.schedulers.PackScheduler`) and its callbacks (MLflow, the progress line, the
first error, the service's sink) are driven by two tuners: Ray Tune's ``Tuner``, and the
driver's own :class:`~.driver.in_process.InProcessTuner` for trials in the driver's process,
which never starts Ray and must not import it either (``import ray`` and ``from ray import
tune`` cost about 0.95 CPU-s a process: ``docs/explanation/architecture.md``, *Trials in the
driver's process*). So they subclass the light bases here, which have Ray Tune's hook names,
signatures, constants and defaults, and import nothing; the Ray path wraps them in Ray Tune's
own classes (:mod:`.driver.ray_adapters`), which delegate each hook.

``tests/unit/test_tune_hooks.py`` holds every constant here to Ray's own value and every hook
to Ray's name and signature, so a Ray upgrade that renames one fails a test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .trials.view import TrialView

__all__ = [
    "DONE",
    "HOSTNAME",
    "NODE_IP",
    "PID",
    "TIMESTAMP",
    "TIME_THIS_ITER_S",
    "TIME_TOTAL_S",
    "TRAINING_ITERATION",
    "TRIAL_ID",
    "Callback",
    "Scheduler",
    "Searcher",
]

# Ray Tune's names for the fields it adds to every result (``ray.tune.result``)
DONE = "done"  #: the trial ends at this result
TRIAL_ID = "trial_id"
PID = "pid"  #: the reporting process
HOSTNAME = "hostname"
NODE_IP = "node_ip"
TIMESTAMP = "timestamp"  #: when it was reported (whole seconds since the epoch)
TRAINING_ITERATION = "training_iteration"  #: the trial's reports so far, this one included
TIME_THIS_ITER_S = "time_this_iter_s"  #: seconds since the trial's previous report
TIME_TOTAL_S = "time_total_s"  #: seconds since the trial started


class Searcher:
    """A searcher as Ray Tune's ``ray.tune.search.Searcher`` is one: it suggests each trial's
    config and hears of its results and its end.

    Args:
        metric: The result field it optimises (None: none Tune should know of).
        mode: ``"min"`` or ``"max"`` (None: none).
    """

    #: :meth:`suggest`'s answer once no trial will ever be suggested again
    FINISHED = "FINISHED"

    def __init__(self, metric: str | None = None, mode: str | None = None) -> None:
        self._metric, self._mode = metric, mode

    @property
    def metric(self) -> str | None:
        """The result field it optimises."""
        return self._metric

    @property
    def mode(self) -> str | None:
        """Its direction."""
        return self._mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: dict, **spec: Any
    ) -> bool:
        """Take the tuner's metric, mode and search space; whether it did (default: no)."""
        return False

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        """The config of trial ``trial_id``, :attr:`FINISHED`, or None (ask again later)."""
        raise NotImplementedError

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        """A result of a trial the scheduler did not stop there (default: nothing)."""

    def on_trial_complete(
        self, trial_id: str, result: dict | None = None, error: bool = False
    ) -> None:
        """A trial's end: its last result, or ``error`` when it failed."""
        raise NotImplementedError

    def save(self, checkpoint_path: str) -> None:
        """Write its state to ``checkpoint_path`` (Ray Tune saves it during a fit)."""
        raise NotImplementedError

    def restore(self, checkpoint_path: str) -> None:
        """Read what :meth:`save` wrote."""
        raise NotImplementedError


class Scheduler:
    """A scheduler as Ray Tune's ``FIFOScheduler`` is one: it decides at each result whether
    the trial goes on, and hears of its end; the order trials run in is the tuner's (first in,
    first out)."""

    CONTINUE = "CONTINUE"  #: the trial goes on
    PAUSE = "PAUSE"  #: the trial pauses (fedtune's never does)
    STOP = "STOP"  #: the trial ends at this result
    NOOP = "NOOP"

    def on_trial_result(self, tune_controller: Any, trial: TrialView, result: dict) -> str:
        """Whether ``trial`` goes on after ``result`` (default: :attr:`CONTINUE`)."""
        return self.CONTINUE

    def on_trial_complete(self, tune_controller: Any, trial: TrialView, result: dict) -> None:
        """A trial ended with ``result`` (default: nothing)."""

    def on_trial_error(self, tune_controller: Any, trial: TrialView) -> None:
        """A trial failed (default: nothing)."""


class Callback:
    """A callback as Ray Tune's ``ray.tune.Callback`` is one: every hook of Ray Tune's, each
    doing nothing until a subclass says otherwise."""

    def setup(
        self,
        stop: Any = None,
        num_samples: int | None = None,
        total_num_samples: int | None = None,
        **info: Any,
    ) -> None:
        """Once, before the first trial."""

    def on_step_begin(self, iteration: int, trials: list, **info: Any) -> None:
        """At the start of each step of the tuner's loop."""

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        """At the end of each step of the tuner's loop."""

    def on_trial_start(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        """A trial started."""

    def on_trial_restore(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        """A trial was restored from a checkpoint."""

    def on_trial_save(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        """A trial was saved."""

    def on_trial_result(
        self, iteration: int, trials: list, trial: TrialView, result: dict, **info: Any
    ) -> None:
        """A trial reported ``result``."""

    def on_trial_complete(
        self, iteration: int, trials: list, trial: TrialView, **info: Any
    ) -> None:
        """A trial ended (its last result is ``trial.last_result``)."""

    def on_trial_recover(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        """A trial failed and will be retried."""

    def on_trial_error(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        """A trial failed (``trial.get_error()``)."""

    def on_checkpoint(
        self, iteration: int, trials: list, trial: TrialView, checkpoint: Any, **info: Any
    ) -> None:
        """A trial saved a checkpoint."""

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        """Every trial has ended."""

    def get_state(self) -> dict | None:
        """Its state for an experiment's checkpoint (default: None, none)."""
        return None

    def set_state(self, state: dict) -> None:
        """Take what :meth:`get_state` gave."""
