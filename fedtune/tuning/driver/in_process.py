"""Trials in the driver's own process, without Ray: a study that trains one configuration at a
time on the CPU, or all its configurations at once in one pack.

Such a study (``resources.gpu: 0`` and ``budget.max_concurrent: 1`` or an integer
``resources.pack`` equal to it, or several configurations at once that cost less as one pack
here than through Ray: :func:`.placement.place`; no Ray cluster named) needs no process but the
driver's, and Ray's start and shutdown were most of what its run cost
(``docs/explanation/architecture.md``, *Trials in the driver's process*). With
``run_study(..., in_process=True)`` (``fedtune tune`` without ``--ray``) it runs through
:class:`InProcessTuner`, which takes the place of Ray Tune's ``Tuner`` and drives the same parts
as Ray Tune does: the study's searcher (:class:`~.pack_members.PackSearch`), its scheduler
(:class:`~..trials.schedulers.PackScheduler`), its callbacks and its trainable
(:func:`~..trials.trainable.train_pack`), with the hooks called in the order of Ray Tune's
controller (``ray.tune.execution.tune_controller``, Ray 2.x):

* a report: the scheduler decides; the searcher hears of a result the scheduler did not stop;
  the callbacks see it; on ``STOP`` the trial ends there (its result marked ``done``);
* a trial's end: the scheduler, the searcher (with the trial's last result), the callbacks'
  ``on_trial_complete``;
* a trial's error: the scheduler's ``on_trial_error``, the searcher (``error=True``), the
  callbacks' ``on_trial_error`` (the trial's ``get_error`` gives its traceback); an error of the
  searcher, the scheduler or a callback ends the study, as it ends Ray Tune's ``fit``;
* a pack's stops and refills: through a :class:`~..packing.box.LocalBox` (the pack's
  :class:`~..packing.box.Box`), answered by the time the pack reads the answer (its reports are
  processed before ``report`` returns);
* the study's time budget (``budget.time``): checked before each trial and at each report, as
  Ray Tune checks it at each step; a trial in flight at the budget is left as Ray Tune leaves it,
  running, and recorded as interrupted by the fit.

The order is a contract: ``tests/integration/test_tune_contract.py`` runs one recording
searcher, scheduler and callback on this tuner and on Ray Tune, and holds both to the same
calls in the same order with the same results.

Each trial runs with the placement's threads (``torch.set_num_threads``): ``resources.cpu``, as
Ray runs a trial process with ``OMP_NUM_THREADS`` set to its CPUs, or for a pack placed by cost
the count its measurement found faster. Nothing here imports Ray: the parts it drives subclass
the Ray-free bases of :mod:`~..tune_hooks`, whose constants and result fields it uses.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .. import tune_hooks as hooks

__all__ = ["IN_PROCESS", "InProcessTuner", "LocalTrial", "in_process_note"]

#: how the ``packing`` line of such a study ends
IN_PROCESS = "in the driver's process (no Ray)"


def in_process_note(size: int, why: str = "") -> str:
    """The study's ``packing`` line: how many configurations train at once, and where.

    Args:
        size: Configurations at once.
        why: The cost estimate that chose this process ("": the spec's values did).

    Returns:
        One line, ending in :data:`IN_PROCESS`.
    """
    if size == 1:
        return f"one configuration at a time, {IN_PROCESS}"
    because = f" ({why})" if why else ""
    return f"{size} configurations at a time in one pack{because}, {IN_PROCESS}"


class LocalTrial:
    """A trial as the searcher, the scheduler and the callbacks read one of Ray Tune's (a
    :class:`~..trials.view.TrialView`): its ``trial_id``, ``config``, ``last_result`` and
    error.

    Args:
        trial_id: Its id (``local_<index>``).
        config: The config its searcher suggested.
    """

    def __init__(self, trial_id: str, config: dict[str, Any]) -> None:
        self.trial_id, self.config = trial_id, config
        self.last_result: dict[str, Any] = {}
        self.error_file: str | None = None
        self._error: str | None = None

    def get_error(self) -> str | None:
        """The trial's traceback, once it failed (None while it has none)."""
        return self._error


class _Stopped(BaseException):
    """The scheduler stopped the trial at a report (no ``except Exception`` on the way out)."""


class _OutOfTime(BaseException):
    """The study's time budget ran out at a report."""


class _DriverFailed(BaseException):
    """The searcher, the scheduler or a callback failed on a report: the study's error, not
    the trial's (Ray Tune's ``fit`` raises it), carried past the trial's own ``except``.

    Args:
        error: What they raised.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


@dataclass
class _Clock:
    """The study's time budget, from the fit's start (None: none)."""

    budget_s: float | None
    start: float

    def out(self) -> bool:
        return self.budget_s is not None and time.monotonic() - self.start >= self.budget_s


class InProcessTuner:
    """Ray Tune's ``Tuner`` for a study whose trials fit the driver's process (module
    docstring).

    Args:
        trainable: ``trainable(config, report=...)``: trains one trial, calling ``report(result)``
            for each of its reports.
        searcher: The study's searcher (a :class:`~..tune_hooks.Searcher`).
        scheduler: The study's scheduler (a :class:`~..tune_hooks.Scheduler`).
        callbacks: The study's callbacks (each a :class:`~..tune_hooks.Callback`).
        num_samples: Trials to run at most (-1: no limit).
        time_budget_s: The study's time budget (None: none).
        threads: Torch threads while trials run (the placement's: :attr:`.placement.Placement.threads`).
    """

    def __init__(
        self,
        trainable: Callable[..., None],
        searcher: hooks.Searcher,
        scheduler: hooks.Scheduler,
        callbacks: Sequence[hooks.Callback],
        num_samples: int,
        time_budget_s: float | None,
        threads: int,
    ) -> None:
        self.trainable, self.searcher, self.scheduler = trainable, searcher, scheduler
        self.callbacks = list(callbacks)
        self.num_samples, self.time_budget_s, self.threads = num_samples, time_budget_s, threads
        self.trials: list[LocalTrial] = []
        self._iteration = 0

    def fit(self) -> None:
        """Run trials one after another until the searcher, the budget or the time ends it."""
        clock = _Clock(self.time_budget_s, time.monotonic())
        self.searcher.set_search_properties(None, None, {})
        self._each("setup", stop=None, num_samples=self.num_samples)
        with _threads(self.threads):
            while self.num_samples < 0 or len(self.trials) < self.num_samples:
                if clock.out():
                    break
                trial_id = f"local_{len(self.trials):05d}"
                config = self.searcher.suggest(trial_id)
                # None asks again once a trial in flight ends: with none in flight, nothing will
                if config is None or config == hooks.Searcher.FINISHED:
                    break
                trial = LocalTrial(trial_id, config)
                self.trials.append(trial)
                if not self._run(trial, clock):
                    break
        self._each("on_experiment_end", trials=self.trials)

    def _run(self, trial: LocalTrial, clock: _Clock) -> bool:
        """Run one trial to its end; False when the time budget ended it (and the study)."""
        self._each("on_trial_start", iteration=self._iteration, trials=self.trials, trial=trial)
        report = _Reporter(self, trial, clock)
        try:
            self.trainable(trial.config, report=report)
        except _Stopped:
            pass  # ended at the report that stopped it (_Reporter.__call__)
        except _OutOfTime:
            return False
        except _DriverFailed as failed:
            raise failed.error from None
        except Exception:  # the trial's failure, as Ray Tune records one
            trial._error = traceback.format_exc()
            self.scheduler.on_trial_error(None, trial)
            self.searcher.on_trial_complete(trial.trial_id, error=True)
            self._each("on_trial_error", iteration=self._iteration, trials=self.trials, trial=trial)
            return True
        else:
            self._complete(trial)
        return True

    def _complete(self, trial: LocalTrial) -> None:
        self.scheduler.on_trial_complete(None, trial, trial.last_result)
        self.searcher.on_trial_complete(trial.trial_id, result=trial.last_result)
        self._each("on_trial_complete", iteration=self._iteration, trials=self.trials, trial=trial)

    def _result(self, trial: LocalTrial, metrics: dict[str, Any], stats: dict[str, Any]) -> bool:
        """Process one report of ``trial`` as Ray Tune's controller does; False: stop it."""
        self._iteration += 1
        result = {**metrics, **stats, hooks.TRIAL_ID: trial.trial_id, hooks.DONE: False}
        decision = self.scheduler.on_trial_result(None, trial, result)
        if decision == hooks.Scheduler.STOP:
            result[hooks.DONE] = True
        else:
            self.searcher.on_trial_result(trial.trial_id, result)
        self._each(
            "on_trial_result",
            iteration=self._iteration,
            trials=self.trials,
            trial=trial,
            result=result,
        )
        trial.last_result = result
        if decision == hooks.Scheduler.STOP:
            self._complete(trial)
            return False
        return True

    def _each(self, hook: str, **kwargs: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, hook)(**kwargs)


class _Reporter:
    """A trial's ``report``: Ray Tune's own per-result fields, then the tuner's processing."""

    def __init__(self, tuner: InProcessTuner, trial: LocalTrial, clock: _Clock) -> None:
        self.tuner, self.trial, self.clock = tuner, trial, clock
        self.iteration = 0
        self.start = self.last = time.monotonic()
        self.where = {
            hooks.PID: os.getpid(),
            hooks.HOSTNAME: socket.gethostname(),
            hooks.NODE_IP: "127.0.0.1",
        }

    def __call__(self, metrics: dict[str, Any]) -> None:
        now = time.monotonic()
        self.iteration += 1
        stats = {
            **self.where,
            hooks.TRAINING_ITERATION: self.iteration,
            hooks.TIMESTAMP: int(time.time()),
            hooks.TIME_THIS_ITER_S: now - self.last,
            hooks.TIME_TOTAL_S: now - self.start,
        }
        self.last = now
        try:
            goes_on = self.tuner._result(self.trial, metrics, stats)
        except Exception as exc:
            raise _DriverFailed(exc) from exc
        if not goes_on:
            raise _Stopped
        if self.clock.out():
            raise _OutOfTime


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    """Torch's intra-op threads set to ``count`` while trials run, restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(max(1, count))
    try:
        yield
    finally:
        torch.set_num_threads(before)
