"""The Ray Tune schedulers a study's :class:`~.stop_rules.Stopper` hands to Tune.

A stopper with its own rule runs under :class:`RuleScheduler`, a FIFO scheduler that asks it
after every reported round; a Ray Tune scheduler (ASHA, the median stopping rule, none) is
built by :func:`ray_scheduler` and decides by itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    MedianStoppingRule,
    TrialScheduler,
)

from ..keys import HISTORY, OBJECTIVE, ROUND, TRIAL_KEY
from .stop_rules import Stopper, StopReason, TuneSchedulerStopper

__all__ = ["RoundFeed", "RuleScheduler", "ray_scheduler", "tune_scheduler"]


def tune_scheduler(stopper: Stopper) -> TrialScheduler:
    """The Ray Tune scheduler that carries a study's stopper into Tune.

    Args:
        stopper: The study's stopper (:func:`.stoppers.stopper_for`).

    Returns:
        The Ray Tune scheduler a :class:`~.stop_rules.TuneSchedulerStopper` names, else a
        :class:`RuleScheduler` that asks the stopper after every reported round.
    """
    if isinstance(stopper, TuneSchedulerStopper):
        s = stopper
        return ray_scheduler(s.scheduler, s.rounds, s.grace, s.factor, s.mode)
    return RuleScheduler(stopper)


class RoundFeed:
    """Hands a stopper each trial's new rounds, once: the one loop over a report's rounds of
    :class:`RuleScheduler` and of a pack's scheduler (``fedtune.tuning.packing.driver``).

    A report carries the rounds since the previous one (``HISTORY``) with the running
    selection-rule value under ``OBJECTIVE``; rounds already seen are skipped (a function
    trainable's final result can be delivered twice), and so are rounds without a value.

    Args:
        stopper: The study's stopper.
    """

    def __init__(self, stopper: Stopper) -> None:
        self.stopper = stopper
        self._seen: dict[int, int] = {}

    def observe(self, number: int, history: Iterable[Mapping[str, Any]]) -> StopReason | None:
        """Give the stopper trial ``number``'s new rounds of ``history``.

        Returns:
            Why the trial stops, or None (it goes on, or the report had no new round).
        """
        last = self._seen.get(number, 0)
        values = []
        for row in history:
            if row[ROUND] <= last or row.get(OBJECTIVE) is None:
                continue
            values.append(float(row[OBJECTIVE]))
            last = int(row[ROUND])
        self._seen[number] = last
        return self.stopper.observe(number, values) if values else None


class RuleScheduler(FIFOScheduler):
    """Stops a trial when its study's stopper says so, after every report (:class:`RoundFeed`).

    Args:
        stopper: The study's stopper.
    """

    def __init__(self, stopper: Stopper) -> None:
        super().__init__()
        self.stopper = stopper
        self.feed = RoundFeed(stopper)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        reason = self.feed.observe(int(trial.config[TRIAL_KEY]), result.get(HISTORY, ()))
        return TrialScheduler.STOP if reason else TrialScheduler.CONTINUE


def ray_scheduler(name: str, rounds: int, grace: int, factor: float, mode: str) -> Any:
    """A Ray Tune scheduler over rounds, on the running selection-rule value.

    Args:
        name: ``asha``, ``median`` or ``none``.
        rounds: Rounds of a complete trial (ASHA's ``max_t``).
        grace: Rounds before the first stop.
        factor: ASHA's reduction factor.
        mode: ``min`` or ``max``.

    Returns:
        ``ASHAScheduler``, ``MedianStoppingRule`` or (none) ``FIFOScheduler``.
    """
    common = {"time_attr": ROUND, "metric": OBJECTIVE, "mode": mode, "grace_period": grace}
    if name == "asha":
        return ASHAScheduler(max_t=rounds, reduction_factor=factor, **common)
    if name == "median":
        return MedianStoppingRule(min_samples_required=3, **common)
    return FIFOScheduler()
