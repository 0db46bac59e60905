"""The search strategies: one table from each ``search.strategy`` name to its parts.

:data:`STRATEGIES` gives each strategy its sampler, its stopper (how its trials are stopped
early) and the descriptions that ``fedtune tune`` and the strategies reference show; the spec
(:mod:`.spec`) validates and resolves names through it, :func:`.stoppers.stopper_for` builds a
study's stopper from it, and ``tools/docs_gen.py`` writes ``docs/reference/strategies.md`` from it.
The measurements behind the default: ``docs/explanation/search-strategies.md``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "DEFAULT_STRATEGY",
    "STRATEGIES",
    "SamplerName",
    "SchedulerName",
    "StopperKind",
    "Strategy",
    "StrategyDef",
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


class StopperKind(enum.StrEnum):
    """How a strategy stops its trials early (built by :func:`.stoppers.stopper_for`)."""

    SCHEDULER = "scheduler"  # the scheduler the strategy names (successive halving, median, none)
    GUARD = "guard"  # the guard rule against the incumbent
    SWEEP_AND_RULE = "sweep_and_rule"  # the γ = η sweep, then the selection rule
    HYPERBAND = "hyperband"  # Optuna's Hyperband pruner over rounds


@dataclass(frozen=True)
class StrategyDef:
    """One search strategy.

    Args:
        sampler: The Optuna sampler that proposes its points (built by
            :func:`~fedtune.tuning.optuna.search.make_sampler`).
        scheduler: The scheduler that stops its trials (asha, median, none); None: its own
            stop rule.
        stopper: How its trials are stopped (:func:`.stoppers.stopper_for` builds it).
        summary: What it is made of, in a few words (``fedtune tune``'s ``search`` line).
        description: What it does (the strategies reference).
    """

    sampler: SamplerName
    scheduler: SchedulerName | None
    stopper: StopperKind
    summary: str
    description: str

    @property
    def own_stop_rule(self) -> bool:
        """Whether fedtune's own rule, not a named scheduler, stops its trials."""
        return self.scheduler is None


#: every search strategy, in the order the reference lists them
STRATEGIES: Mapping[Strategy, StrategyDef] = {
    Strategy.TRADEOFF: StrategyDef(
        SamplerName.TPE,
        None,
        StopperKind.SWEEP_AND_RULE,
        "γ = η sweep, then TPE + selection-rule stopping",
        "theory-guided γ = η sweep, selection-rule stopping against the incumbent (1 % margin, "
        "plus a plateau rule for sweep steps), then TPE; built on quadratics",
    ),
    Strategy.TPE: StrategyDef(
        SamplerName.TPE,
        SchedulerName.NONE,
        StopperKind.SCHEDULER,
        "TPE sampler, no early stopping",
        "TPE, no early stopping",
    ),
    Strategy.RANDOM: StrategyDef(
        SamplerName.RANDOM,
        SchedulerName.NONE,
        StopperKind.SCHEDULER,
        "random sampler, no early stopping",
        "random search, no early stopping",
    ),
    Strategy.ASHA: StrategyDef(
        SamplerName.TPE,
        SchedulerName.ASHA,
        StopperKind.SCHEDULER,
        "TPE sampler + ASHA scheduler",
        "TPE + ASHA (asynchronous successive halving, Optuna's pruner over rounds)",
    ),
    Strategy.MEDIAN: StrategyDef(
        SamplerName.TPE,
        SchedulerName.MEDIAN,
        StopperKind.SCHEDULER,
        "TPE sampler + median stopping rule",
        "TPE + the median stopping rule (Optuna's median pruner over rounds)",
    ),
    Strategy.HYPERBAND: StrategyDef(
        SamplerName.TPE,
        None,
        StopperKind.HYPERBAND,
        "TPE sampler + Hyperband pruner",
        "TPE + Optuna's Hyperband pruner over rounds (successive halving at equal rounds, "
        "several brackets)",
    ),
    Strategy.TPE_GUARD: StrategyDef(
        SamplerName.TPE,
        None,
        StopperKind.GUARD,
        "TPE sampler + guard stop rule",
        "TPE, and a trial is stopped only when it is twice as bad as the incumbent *at the same "
        "round* and cannot catch up at its own rate",
    ),
}

#: the strategy of a new single-objective study that names none (chosen on the search suite)
DEFAULT_STRATEGY = Strategy.TPE_GUARD
