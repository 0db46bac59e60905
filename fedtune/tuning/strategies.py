"""The search strategies: one table from each ``search.strategy`` name to its parts.

:data:`STRATEGIES` gives each strategy its sampler, its stopper (how its trials are stopped
early) and the descriptions that ``fedtune tune`` and the strategies reference show; the spec
(:mod:`.spec`) validates and resolves names through it, :func:`stopper_for` builds a study's
stopper from it, and ``tools/docs_gen.py`` writes ``docs/reference/strategies.md`` from it.
The measurements behind the default: ``docs/explanation/search-strategies.md``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedtune.search_spaces import SearchSpace

    from .spec import StudySpec
    from .stop_rules import Observed, Stopper

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "SamplerName",
    "SchedulerName",
    "Strategy",
    "StrategyDef",
    "stopper_for",
]


class SamplerName(enum.StrEnum):
    TPE = "tpe"
    RANDOM = "random"
    GRID = "grid"
    NSGA2 = "nsga2"
    GP = "gp"
    CMAES = "cmaes"


class SchedulerName(enum.StrEnum):
    ASHA = "asha"
    MEDIAN = "median"
    NONE = "none"


class Strategy(enum.StrEnum):
    """``search.strategy``: how trials are proposed and stopped early (a sampler and a stopper).

    Without a strategy, a study that names ``sampler.name`` or ``scheduler.name`` (or has several
    objectives) uses those.
    """

    TRADEOFF = "tradeoff"
    TPE = "tpe"
    RANDOM = "random"
    ASHA = "asha"
    MEDIAN = "median"
    HYPERBAND = "hyperband"
    TPE_GUARD = "tpe_guard"


#: builds a study's stopper from (spec, search space, rounds per trial)
StopperFactory = Callable[["StudySpec", "SearchSpace", int], "Stopper"]


@dataclass(frozen=True)
class StrategyDef:
    """One search strategy.

    Args:
        sampler: The Optuna sampler that proposes its points (built by
            :func:`~.optuna_glue.make_sampler`).
        scheduler: The Ray Tune scheduler that stops its trials; None: its own stop rule.
        stopper: Builds the study's stopper.
        summary: What it is made of, in a few words (``fedtune tune``'s ``search`` line).
        description: What it does (the strategies reference).
    """

    sampler: SamplerName
    scheduler: SchedulerName | None
    stopper: StopperFactory
    summary: str
    description: str

    @property
    def own_stop_rule(self) -> bool:
        """Whether fedtune's own rule, not a Ray Tune scheduler, stops its trials."""
        return self.scheduler is None


def _minimize(spec: StudySpec) -> bool:
    return str(spec.objective.directions[0]) == "min"


def _tune_scheduler(spec: StudySpec, space: SearchSpace, rounds: int) -> Stopper:
    """The study's Ray Tune scheduler (``scheduler_name``) as its stopper."""
    from .stop_rules import TuneSchedulerStopper

    s, name = spec.scheduler, spec.scheduler_name
    return TuneSchedulerStopper(
        str(name), rounds, s.grace_rounds, s.reduction_factor, str(spec.objective.directions[0])
    )


def _guard(spec: StudySpec, space: SearchSpace, rounds: int) -> Stopper:
    """``tpe_guard``: :meth:`~.stop_rules.StopRule.guard` against the incumbent, no sweep."""
    from .stop_rules import IncumbentStopper, StopRule

    rule = StopRule.guard(rounds, spec.objective.last_rounds, _minimize(spec))
    return IncumbentStopper(None, rule)


def _sweep_and_rule(spec: StudySpec, space: SearchSpace, rounds: int) -> Stopper:
    """``tradeoff``: the γ = η sweep, then :meth:`~.stop_rules.StopRule.for_study`."""
    from .stop_rules import IncumbentStopper, StopRule, TheorySweep

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


#: every search strategy, in the order the reference lists them
STRATEGIES: Mapping[Strategy, StrategyDef] = {
    Strategy.TRADEOFF: StrategyDef(
        SamplerName.TPE,
        None,
        _sweep_and_rule,
        "γ = η sweep, then TPE + selection-rule stopping",
        "theory-guided γ = η sweep, selection-rule stopping against the incumbent (1 % margin, "
        "plus a plateau rule for sweep steps), then TPE; built on quadratics",
    ),
    Strategy.TPE: StrategyDef(
        SamplerName.TPE,
        SchedulerName.NONE,
        _tune_scheduler,
        "TPE sampler, no early stopping",
        "TPE, no early stopping",
    ),
    Strategy.RANDOM: StrategyDef(
        SamplerName.RANDOM,
        SchedulerName.NONE,
        _tune_scheduler,
        "random sampler, no early stopping",
        "random search, no early stopping",
    ),
    Strategy.ASHA: StrategyDef(
        SamplerName.TPE,
        SchedulerName.ASHA,
        _tune_scheduler,
        "TPE sampler + ASHA scheduler",
        "TPE + Ray Tune's ASHA (asynchronous successive halving)",
    ),
    Strategy.MEDIAN: StrategyDef(
        SamplerName.TPE,
        SchedulerName.MEDIAN,
        _tune_scheduler,
        "TPE sampler + median stopping rule",
        "TPE + Ray Tune's median stopping rule",
    ),
    Strategy.HYPERBAND: StrategyDef(
        SamplerName.TPE,
        None,
        _hyperband,
        "TPE sampler + Hyperband pruner",
        "TPE + Optuna's Hyperband pruner over rounds (successive halving at equal rounds, "
        "several brackets)",
    ),
    Strategy.TPE_GUARD: StrategyDef(
        SamplerName.TPE,
        None,
        _guard,
        "TPE sampler + guard stop rule",
        "TPE, and a trial is stopped only when it is twice as bad as the incumbent *at the same "
        "round* and cannot catch up at its own rate",
    ),
}

#: the strategy of a new single-objective study that names none (chosen on the search suite)
DEFAULT_STRATEGY = Strategy.TPE_GUARD


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
        The stopper the searcher and Ray Tune's scheduler ask.
    """
    strategy = spec.strategy
    build = STRATEGIES[strategy].stopper if strategy is not None else _tune_scheduler
    stopper = build(spec, space, rounds)
    if history:
        stopper.resume(history)
    return stopper
