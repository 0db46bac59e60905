"""Who stops a study's trials: the :class:`Stopper` interface and every stopper behind it.

A study has exactly one stopper (built by :func:`fedtune.tuning.trials.stoppers.stopper_for`); the
searcher (:class:`~fedtune.tuning.optuna.searcher.FedtuneSearch`) and the study's Ray Tune scheduler
(:class:`~.schedulers.PackScheduler`), both in the driver, talk only to it, and it decides on
each configuration, whatever its pack:

* :class:`IncumbentStopper` — fedtune's selection-rule stopping against the incumbent
  (:class:`StopRule`): ``tpe_guard`` (:meth:`StopRule.guard`) and, with the theory-guided sweep
  (:class:`~.sweep.TheorySweep`, its own module: it proposes points, it stops nothing)
  proposing its first points, ``tradeoff``;
* :class:`PrunerStopper` — an Optuna pruner fed every round: ``hyperband``, ``asha``
  (asynchronous successive halving) and the ``median`` rule;
* :class:`NeverStop` — no early stopping (``tpe``, ``random``, ``scheduler.name: none``).

Nothing here imports Ray: the in-process benchmark uses the stoppers as a study does. Why the
rules are what they are: ``docs/explanation/search-strategies.md``.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedtune.outcomes import RUNNING, TrialOutcome

if TYPE_CHECKING:
    import optuna

    from .sweep import TheorySweep

__all__ = [
    "IncumbentStopper",
    "NeverStop",
    "Observed",
    "PrunerStopper",
    "StopReason",
    "StopRule",
    "Stopper",
    "relative_gap",
]


class StopReason(enum.StrEnum):
    """Why a stop rule stopped a trial (Optuna user attribute ``stop_rule``)."""

    WORSE = "worse"
    PLATEAU = "plateau"
    RUNG = "rung"  # not in the top 1/factor of the values at a rung's round (successive halving)
    MEDIAN = "median"  # below the median of the other trials at the same round


WORSE, PLATEAU, RUNG = StopReason.WORSE, StopReason.PLATEAU, StopReason.RUNG


def relative_gap(value: float, reference: float, minimize: bool = True) -> float:
    """How much worse ``value`` is than ``reference`` (0 = equal, 0.01 = 1 % worse)."""
    if not math.isfinite(value):
        return math.inf
    worse, better = (value, reference) if minimize else (reference, value)
    scale = max(abs(better), 1e-12)
    return (worse - better) / scale


# -- the interface ----------------------------------------------------------------------------
class Stopper(abc.ABC):
    """Decides which of a study's trials stop before their last round (one per study)."""

    def propose(self) -> tuple[str, dict[str, Any]] | None:
        """The next point to run ahead of the sampler's, if this stopper proposes points.

        Returns:
            ``(tag, point)`` (the tag goes to the trial's :data:`~.sweep.SWEEP_ATTR`), or None: the sampler
            picks the next point.
        """
        return None

    def started(self, number: int, tag: str | None = None) -> None:
        """Note that a trial started.

        Args:
            number: The trial's Optuna number.
            tag: The tag of the proposal it runs (None: the sampler's point).
        """
        return None

    @abc.abstractmethod
    def observe(self, number: int, values: Sequence[float]) -> StopReason | None:
        """Take a trial's new rounds and decide whether it stops.

        Args:
            number: The trial's Optuna number.
            values: The selection-rule value after each new round, in order.

        Returns:
            Why the trial stops now (or stopped before), or None: it goes on.
        """

    def complete(self, number: int, outcome: str, value: float | None) -> None:
        """Note that a trial ended.

        Args:
            number: The trial's Optuna number.
            outcome: Its outcome (``fedtune.outcomes.TrialOutcome``).
            value: Its selection-rule value when it completed, else None.
        """
        return None

    def stop_reason(self, number: int) -> StopReason | None:
        """Why this stopper stopped a trial.

        Args:
            number: The trial's Optuna number.

        Returns:
            The reason, or None: not stopped by this stopper's own decision.
        """
        return None

    def resume(self, history: Mapping[int, tuple[str | None, Observed | None]]) -> None:
        """Take the trials of an earlier invocation of the study (a resume).

        Args:
            history: Trial number to its proposal tag and outcome
                (:func:`~fedtune.tuning.optuna.search.sweep_history`).
        """
        return None


# -- the selection-rule stop rule --------------------------------------------------------------
@dataclass(frozen=True)
class StopRule:
    """Decisions on selection-rule curves (``curve[t-1]`` = objective after round t)."""

    rounds: int  # T, the rounds of a complete trial
    window: int  # rounds over which the own rate / the plateau is measured
    grace: int  # no "worse" decision before this round
    margin: float = 0.01
    plateau_tol: float = 0.05
    minimize: bool = True
    at_round_margin: float | None = None  # gap at the same round that counts (None: margin)

    @classmethod
    def for_study(cls, rounds: int, last_rounds: int, minimize: bool = True) -> StopRule:
        """Window T/6 (at most N, at least 2); grace T/3: a non-convex model's curve starts
        flat and then drops, so an early own rate says little (measured on the digits MLP:
        with grace = window = T/6 TPE's trials were all stopped at round 5)."""
        window = max(2, min(last_rounds, rounds // 6))
        return cls(rounds=rounds, window=window, grace=max(window, rounds // 3), minimize=minimize)

    @classmethod
    def guard(cls, rounds: int, last_rounds: int, minimize: bool = True) -> StopRule:
        """``tpe_guard``'s rule: the same equal-round test, but a trial must be *twice* as bad
        as the incumbent was at the same round (relative gap > 1) and, improving at its current
        rate until the last round, still end worse than the incumbent's final value. Such a
        trial (blown up, oscillating, or far behind and flattening) cannot be the selection
        rule's pick; a slow starter that is still improving is never stopped."""
        rule = cls.for_study(rounds, last_rounds, minimize)
        return dataclasses.replace(rule, at_round_margin=1.0)

    def gap(self, curve: Sequence[float], incumbent: Sequence[float], t: int) -> float:
        return relative_gap(curve[t - 1], incumbent[min(t, len(incumbent)) - 1], self.minimize)

    def worse(self, curve: Sequence[float], incumbent: Sequence[float] | None) -> bool:
        """Worse than the incumbent at this round, and even its own current rate of
        improvement, kept up to the last round, would not bring it within ``margin`` of the
        incumbent's final value."""
        t = len(curve)
        if not incumbent or t < self.grace:
            return False
        at_round = self.margin if self.at_round_margin is None else self.at_round_margin
        if self.gap(curve, incumbent, t) <= at_round:
            return False
        now, before = curve[t - 1], curve[t - self.window]
        rate = (before - now) / (self.window - 1) if math.isfinite(before) else 0.0
        rate = rate if self.minimize else -rate
        projected = now - max(0.0, rate) * (self.rounds - t) * (1 if self.minimize else -1)
        return relative_gap(projected, incumbent[-1], self.minimize) > self.margin

    def raw_worse(self, curve: Sequence[float], incumbent: Sequence[float] | None) -> bool:
        """The comparison an early rung makes: this round's value only (for contrast in tests)."""
        t = len(curve)
        return bool(incumbent) and t >= self.window and self.gap(curve, incumbent, t) > self.margin

    def plateaued(self, curve: Sequence[float]) -> bool:
        """Flat over the last window within the first half of the rounds (step too large)."""
        t = len(curve)
        if t < 2 * self.window or t > self.rounds // 2:
            return False
        improvement = relative_gap(curve[t - self.window - 1], curve[t - 1], self.minimize)
        return improvement < self.plateau_tol

    def decide(
        self, curve: Sequence[float], incumbent: Sequence[float] | None, line: bool
    ) -> StopReason | None:
        """``worse``, ``plateau`` (only for a line trial with a smaller step left) or None."""
        if self.worse(curve, incumbent):
            return WORSE
        if line and self.plateaued(curve):
            return PLATEAU
        return None


# -- a finished trial, as a stopper is told it --------------------------------------------------
@dataclass(frozen=True)
class Observed:
    """One trial as a stopper (and its sweep) sees it: its tag, outcome and selection-rule value."""

    tag: str
    outcome: str  # completed | diverged | stopped | failed | running
    value: float | None = None
    stop: str | None = None  # a StopReason when stopped by the rule

    @property
    def good(self) -> bool:
        return (
            self.outcome == TrialOutcome.COMPLETED
            and self.value is not None
            and math.isfinite(self.value)
        )


# -- selection-rule stopping against the incumbent (``tpe_guard``, ``tradeoff``) --------------
@dataclass
class IncumbentStopper(Stopper):
    """Stops a trial by :class:`StopRule` against the best completed trial (the incumbent).

    With a :class:`~.sweep.TheorySweep` it also proposes the sweep's points ahead of the sampler's
    (``tradeoff``); without one it only stops (``tpe_guard``).

    Args:
        sweep: The sweep that proposes points (None: the sampler picks every point).
        rule: The stop rule.
    """

    sweep: TheorySweep | None
    rule: StopRule
    tags: dict[int, str] = field(default_factory=dict)  # trial number -> sweep tag
    curves: dict[int, list[float]] = field(default_factory=dict)  # number -> objective curve
    stops: dict[int, StopReason] = field(default_factory=dict)  # number -> why it stopped
    finished: dict[int, Observed] = field(default_factory=dict)
    incumbent: tuple[float, list[float]] | None = None

    def propose(self) -> tuple[str, dict[str, Any]] | None:
        if self.sweep is None:
            return None
        seen = [self.finished.get(n, Observed(tag, RUNNING)) for n, tag in self.tags.items()]
        return self.sweep.propose(seen)

    def started(self, number: int, tag: str | None = None) -> None:
        if tag:
            self.tags[number] = tag

    def observe(self, number: int, values: Sequence[float]) -> StopReason | None:
        curve = self.curves.setdefault(number, [])
        curve.extend(values)
        if not curve or number in self.stops:
            return self.stops.get(number)
        incumbent = self.incumbent[1] if self.incumbent else None
        line = self.tags.get(number, "").startswith("line:") and self._smaller_step_left(number)
        reason = self.rule.decide(curve, incumbent, line)
        if reason:
            self.stops[number] = reason
        return reason

    def _smaller_step_left(self, number: int) -> bool:
        i = int(self.tags[number].split(":")[1])
        return self.sweep.line(i + 1) >= self.sweep.bottom - 1e-9

    def complete(self, number: int, outcome: str, value: float | None) -> None:
        tag = self.tags.get(number)
        observed = Observed(tag or "", outcome, value, self.stops.get(number))
        if tag:
            self.finished[number] = observed
        if not observed.good:
            return
        if self.incumbent is None or relative_gap(value, self.incumbent[0], self.rule.minimize) < 0:
            self.incumbent = (value, list(self.curves.get(number, [])))

    def stop_reason(self, number: int) -> StopReason | None:
        return self.stops.get(number)

    def resume(self, history: Mapping[int, tuple[str | None, Observed | None]]) -> None:
        """Take the sweep's tags and outcomes of an earlier invocation (no curves).

        Args:
            history: Trial number to its sweep tag and outcome.
        """
        for number, (tag, observed) in history.items():
            if tag:
                self.tags[number] = tag
            if tag and observed is not None:
                self.finished[number] = observed


# -- an Optuna pruner over rounds (``hyperband``) --------------------------------------------
class PrunerStopper(Stopper):
    """Stops a trial when an Optuna pruner, fed the selection-rule value of every round, says so.

    The pruner decides on a private in-memory Optuna study, named like the study and with the
    same trial numbers (so the Hyperband bracket of trial n is the one Optuna assigns to it):
    the same decisions in a study and in the in-process benchmark.

    Args:
        pruner: The pruner (:meth:`hyperband`, :meth:`successive_halving`, :meth:`median`).
        name: The study's name.
        minimize: The objective is minimised.
        reason: What a stop by this pruner is called (Optuna user attribute ``stop_rule``).
    """

    def __init__(
        self,
        pruner: optuna.pruners.BasePruner,
        name: str,
        minimize: bool = True,
        reason: StopReason = StopReason.RUNG,
    ):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.mirror = optuna.create_study(
            study_name=name,
            direction="minimize" if minimize else "maximize",
            pruner=pruner,
            sampler=optuna.samplers.RandomSampler(seed=0),
        )
        self.trials: list[optuna.Trial] = []
        self.curves: dict[int, list[float]] = {}
        self.stops: dict[int, StopReason] = {}
        self.finished: dict[int, str] = {}
        self.reason = reason

    @classmethod
    def hyperband(
        cls, name: str, rounds: int, grace: int, factor: float, minimize: bool = True
    ) -> PrunerStopper:
        """Optuna's ``HyperbandPruner`` over rounds.

        Args:
            name: The study's name.
            rounds: Rounds of a complete trial (the last rung).
            grace: The largest first rung (``scheduler.grace_rounds``).
            factor: The reduction factor (``scheduler.reduction_factor``).
            minimize: The objective is minimised.

        Returns:
            The stopper, with first rung clamp(rounds/9, 1, grace).
        """
        import optuna

        r0 = max(1, min(grace, rounds // 9))
        pruner = optuna.pruners.HyperbandPruner(
            min_resource=r0, max_resource=rounds, reduction_factor=max(2, int(factor))
        )
        return cls(pruner, name, minimize)

    @classmethod
    def successive_halving(
        cls, name: str, grace: int, factor: float, minimize: bool = True
    ) -> PrunerStopper:
        """``asha``: Optuna's ``SuccessiveHalvingPruner`` over rounds (asynchronous successive
        halving, Li et al. 2020, arXiv:1810.05934: rungs at ``grace · factor^k`` rounds, the top
        1/factor of the values seen at a rung go on).

        Args:
            name: The study's name.
            grace: The first rung (``scheduler.grace_rounds``).
            factor: The reduction factor (``scheduler.reduction_factor``).
            minimize: The objective is minimised.

        Returns:
            The stopper.
        """
        import optuna

        pruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=grace, reduction_factor=max(2, int(factor))
        )
        return cls(pruner, name, minimize)

    @classmethod
    def median(cls, name: str, grace: int, minimize: bool = True) -> PrunerStopper:
        """``median``: Optuna's ``MedianPruner`` over rounds (after ``grace`` rounds and 3
        trials, stop a trial whose value is worse than the median of the others' at the same
        round).

        Args:
            name: The study's name.
            grace: Rounds before the first stop (``scheduler.grace_rounds``).
            minimize: The objective is minimised.

        Returns:
            The stopper.
        """
        import optuna

        pruner = optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=grace)
        return cls(pruner, name, minimize, StopReason.MEDIAN)

    def _trial(self, number: int) -> optuna.Trial:
        while len(self.trials) <= number:
            self.trials.append(self.mirror.ask())
        return self.trials[number]

    def started(self, number: int, tag: str | None = None) -> None:
        self._trial(number)

    def observe(self, number: int, values: Sequence[float]) -> StopReason | None:
        if number in self.stops:
            return self.stops[number]
        trial, curve = self._trial(number), self.curves.setdefault(number, [])
        for value in values:
            curve.append(float(value))
            if math.isfinite(value):
                trial.report(float(value), len(curve))
                if trial.should_prune():
                    self.stops[number] = self.reason
                    return self.reason
        return None

    def complete(self, number: int, outcome: str, value: float | None) -> None:
        import optuna

        if number in self.finished:
            return
        trial, state = self._trial(number), optuna.trial.TrialState
        self.finished[number] = outcome
        if outcome == TrialOutcome.COMPLETED and value is not None and math.isfinite(value):
            self.mirror.tell(trial, value)
        else:  # a diverged trial too: the mirror's sampler learns nothing from its value
            stopped = outcome == TrialOutcome.STOPPED
            self.mirror.tell(trial, state=state.PRUNED if stopped else state.FAIL)

    def stop_reason(self, number: int) -> StopReason | None:
        return self.stops.get(number)


# -- no early stopping (``tpe``, ``random``, ``scheduler.name: none``) -------------------------
class NeverStop(Stopper):
    """Lets every trial run all its rounds."""

    def observe(self, number: int, values: Sequence[float]) -> StopReason | None:
        return None
