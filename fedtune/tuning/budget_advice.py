"""How much budget a search needs for a good answer, from the suite's measurements.

The search suite (``benchmarks/search_efficiency.py``, ``docs/explanation/search-strategies.md``)
runs each strategy on seven tasks, three seeds each, at budgets of 8, 16 and 32 *full trials*
(the configuration-rounds of that many trials run to ``train.rounds``; a strategy that stops
trials runs more of them). With the default, ``tpe_guard``, the best configuration came within
1 % of a 9×9 grid's best in 9 of 21 runs at 8 full trials, 12 at 16 and 17 at 32. The suite's
spaces search 3 parameters (γ, η, β); other sizes are scaled linearly, which was not measured.

* recommended: :data:`FULL_TRIALS_MEASURED` full trials for 3 searched parameters,
  ``ceil(32 / 3 · n)`` for n, and at least 16;
* :func:`advice` says when a study's budget is below half of that (for 3 parameters: fewer than
  16 full trials, where the default reached within 1 % in at most 12 of 21 runs, 9 at 8).

A study budgeted in time only, a grid (it has its own count) and a multi-objective study get no
advice.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedtune.search_spaces import SearchSpace

    from .spec import StudySpec

__all__ = ["FULL_TRIALS_MEASURED", "advice", "full_trials", "recommended_full_trials"]

#: full trials after which the default came within 1 % in 17 of 21 suite runs (3 parameters)
FULL_TRIALS_MEASURED = 32
#: the searched parameters of the suite's spaces
PARAMETERS_MEASURED = 3


def recommended_full_trials(parameters: int) -> int:
    """Full trials a search of ``parameters`` parameters needs (see the module docstring)."""
    return max(16, math.ceil(FULL_TRIALS_MEASURED / PARAMETERS_MEASURED * max(parameters, 1)))


def full_trials(spec: StudySpec, trials: int | None = None) -> float | None:
    """The study's budget in full trials: its configuration-rounds over ``train.rounds``, else
    its trials (``trials``: ``fedtune tune --trials``); None when only time bounds it."""
    if spec.budget.configuration_rounds is not None:
        full = spec.budget.configuration_rounds / spec.train.rounds
        count = trials if trials is not None else spec.budget.trials
        return min(full, count) if count is not None else full
    count = trials if trials is not None else spec.budget.trials
    return None if count is None else float(count)


def advice(spec: StudySpec, space: SearchSpace, trials: int | None = None) -> str | None:
    """One line when the study's budget is below half of what its search needs, else None.

    Args:
        spec: The study.
        space: Its search space (its enabled parameters are counted).
        trials: ``fedtune tune --trials``, if given.

    Returns:
        The warning, naming the budget, what it would need and where the figures come from.
    """
    from .strategies import SamplerName

    if spec.objective.is_multi or spec.sampler_name == SamplerName.GRID:
        return None
    full = full_trials(spec, trials)
    parameters = len(space.enabled)
    if full is None or parameters == 0:
        return None
    wanted = recommended_full_trials(parameters)
    if full >= wanted / 2:
        return None
    return (
        f"the budget is {full:g} full trials ({spec.train.rounds} rounds each) for {parameters} "
        f"searched parameters, below the {wanted // 2} the search needs: on its suite the "
        "default came within 1 % of a grid's best in 9 of 21 runs at 8 full trials, 12 at 16 "
        f"and 17 at 32 (3 parameters); give at least {wanted // 2}, better {wanted} "
        f"(budget.trials, or budget.configuration_rounds: {wanted * spec.train.rounds}); "
        "see docs/how-to/search-strategy.md"
    )
