"""A study's stopper, built from its strategy (:data:`.strategies.STRATEGIES`) or, without one,
its ``scheduler.name``: successive halving, the median rule or none, or one of fedtune's own stop
rules (:mod:`.stop_rules`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..spec import StudySpec
from ..strategies import STRATEGIES, SchedulerName, StopperKind

if TYPE_CHECKING:
    from fedtune.search_spaces import SearchSpace

    from .stop_rules import Observed, Stopper

__all__ = ["stopper_for"]

#: builds a study's stopper from (spec, search space, rounds per trial)
StopperFactory = Callable[[StudySpec, "SearchSpace", int], "Stopper"]


def _minimize(spec: StudySpec) -> bool:
    return str(spec.objective.directions[0]) == "min"


def _scheduler(spec: StudySpec, space: SearchSpace, rounds: int) -> Stopper:
    """The study's ``scheduler_name`` as its stopper: ``asha``, ``median`` or ``none``."""
    from .stop_rules import NeverStop, PrunerStopper

    s, name, minimize = spec.scheduler, spec.scheduler_name, _minimize(spec)
    if name == SchedulerName.ASHA:
        return PrunerStopper.successive_halving(
            spec.name, s.grace_rounds, s.reduction_factor, minimize
        )
    if name == SchedulerName.MEDIAN:
        return PrunerStopper.median(spec.name, s.grace_rounds, minimize)
    return NeverStop()


def _guard(spec: StudySpec, space: SearchSpace, rounds: int) -> Stopper:
    """``tpe_guard``: :meth:`~.stop_rules.StopRule.guard` against the incumbent, no sweep."""
    from .stop_rules import IncumbentStopper, StopRule

    rule = StopRule.guard(rounds, spec.objective.last_rounds, _minimize(spec))
    return IncumbentStopper(None, rule)


def _sweep_and_rule(spec: StudySpec, space: SearchSpace, rounds: int) -> Stopper:
    """``tradeoff``: the γ = η sweep, then :meth:`~.stop_rules.StopRule.for_study`."""
    from .stop_rules import IncumbentStopper, StopRule
    from .sweep import TheorySweep

    minimize = _minimize(spec)
    return IncumbentStopper(
        TheorySweep(space, spec.sampler.seed, minimize),
        StopRule.for_study(rounds, spec.objective.last_rounds, minimize),
    )


def _hyperband(spec: StudySpec, space: SearchSpace, rounds: int) -> Stopper:
    """``hyperband``: Optuna's Hyperband pruner over rounds."""
    from .stop_rules import PrunerStopper

    s = spec.scheduler
    return PrunerStopper.hyperband(
        spec.name, rounds, s.grace_rounds, s.reduction_factor, _minimize(spec)
    )


#: how each kind of stopper is built
_BUILD: Mapping[StopperKind, StopperFactory] = {
    StopperKind.SCHEDULER: _scheduler,
    StopperKind.GUARD: _guard,
    StopperKind.SWEEP_AND_RULE: _sweep_and_rule,
    StopperKind.HYPERBAND: _hyperband,
}


def stopper_for(
    spec: StudySpec,
    space: SearchSpace,
    rounds: int,
    history: Mapping[int, tuple[str | None, Observed | None]] | None = None,
) -> Stopper:
    """The study's stopper: its strategy's, else (no strategy) its ``scheduler.name``'s.

    Args:
        spec: The study.
        space: Its search space.
        rounds: Rounds per trial.
        history: The trials of an earlier invocation (a resumed study), if any.

    Returns:
        The stopper the searcher and the study's scheduler ask.
    """
    strategy = spec.strategy
    build = _BUILD[STRATEGIES[strategy].stopper] if strategy is not None else _scheduler
    stopper = build(spec, space, rounds)
    if history:
        stopper.resume(history)
    return stopper
