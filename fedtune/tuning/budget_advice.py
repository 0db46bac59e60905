"""How much budget a search needs for a good answer, from the suite's measurements.

The search suite (``benchmarks/search_efficiency.py``, ``docs/explanation/search-strategies.md``)
runs the default, ``tpe_guard``, on seven tasks of 2 to 4 independently searched parameters
(a tied one, ``tie:``, does not count), five seeds each, at budgets of 16, 32 and 64 *full
trials* (the configuration-rounds of that many trials run to ``train.rounds``; a strategy that
stops trials runs more of them). Its best configuration came within 1 % of the task's grid's
best in 19 of 35 runs at 16 full trials, 28 at 32 and 34 at 64, where every task had at least
4 of 5 seeds within 1 % (``benchmarks/results/search_five_seeds.json``).

* recommended (a good answer): :data:`FULL_TRIALS_RECOMMENDED` full trials for up to
  :data:`PARAMETERS_MEASURED` parameters; beyond, linearly more (not measured);
* :func:`advice` warns below a quarter of that (16 for up to 4 parameters, where the default
  came within 1 % in about half the runs) and notes, in one line, a budget below it.

A study budgeted in time only, a grid (it has its own count) and a multi-objective study get no
advice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedtune.search_spaces import SearchSpace

    from .spec import StudySpec

__all__ = [
    "FULL_TRIALS_RECOMMENDED",
    "Advice",
    "advice",
    "full_trials",
    "recommended_full_trials",
    "searched_parameters",
]

#: full trials at which the default came within 1 % on at least 4 of 5 seeds of every task
FULL_TRIALS_RECOMMENDED = 64
#: the most independently searched parameters of a suite task's space
PARAMETERS_MEASURED = 4
#: the share of the recommendation below which a study is warned
WARN_BELOW = 4


@dataclass(frozen=True)
class Advice:
    """What ``fedtune tune`` says of a new study's budget.

    Args:
        level: ``warning`` (below a quarter of the recommendation) or ``note`` (below it).
        line: One line naming the budget, what a good answer needs and where that comes from.
    """

    level: str
    line: str


def recommended_full_trials(parameters: int) -> int:
    """Full trials a search of ``parameters`` independent parameters needs for a good answer
    (see the module docstring)."""
    per = FULL_TRIALS_RECOMMENDED / PARAMETERS_MEASURED
    return max(FULL_TRIALS_RECOMMENDED, math.ceil(per * parameters))


def searched_parameters(space: SearchSpace) -> int:
    """The space's independently searched parameters (:attr:`SearchSpace.drawn`)."""
    return len(space.drawn)


def full_trials(spec: StudySpec, trials: int | None = None) -> float | None:
    """The study's budget in full trials: its configuration-rounds over ``train.rounds``, else
    its trials (``trials``: ``fedtune tune --trials``); None when only time bounds it."""
    if spec.budget.configuration_rounds is not None:
        full = spec.budget.configuration_rounds / spec.train.rounds
        count = trials if trials is not None else spec.budget.trials
        return min(full, count) if count is not None else full
    count = trials if trials is not None else spec.budget.trials
    return None if count is None else float(count)


def advice(spec: StudySpec, space: SearchSpace, trials: int | None = None) -> Advice | None:
    """What to say of the study's budget when it is below a good answer's, else None.

    Args:
        spec: The study.
        space: Its search space (its independent parameters are counted).
        trials: ``fedtune tune --trials``, if given.

    Returns:
        A warning below a quarter of :func:`recommended_full_trials`, a note below it.
    """
    from .strategies import SamplerName

    if spec.objective.is_multi or spec.sampler_name == SamplerName.GRID:
        return None
    full = full_trials(spec, trials)
    parameters = searched_parameters(space)
    if full is None or parameters == 0:
        return None
    wanted = recommended_full_trials(parameters)
    if full >= wanted:
        return None
    least = wanted // WARN_BELOW
    head = (
        f"the budget is {full:g} full trials ({spec.train.rounds} rounds each) for "
        f"{parameters} searched parameter{'s' if parameters != 1 else ''}"
    )
    give = f"budget.trials, or budget.configuration_rounds: {wanted * spec.train.rounds}"
    suite = (
        "on its suite (2 to 4 parameters, 5 seeds) the default came within 1 % of a grid's "
        "best in 19 of 35 runs at 16 full trials, 28 at 32 and 34 at 64"
    )
    where = "see docs/how-to/search-strategy.md"
    if full < least:
        return Advice(
            "warning",
            f"{head}, below the {least} the search needs: {suite}; give at least {least}, "
            f"better {wanted} ({give}); {where}",
        )
    return Advice("note", f"{head}; a good answer needs {wanted} ({give}): {suite}; {where}")
