"""Ray Tune side of the trade-off strategy: a FIFO scheduler that stops a trial when
:meth:`TradeoffState.observe <fedtune.tuning.tradeoff_search.TradeoffState.observe>` says so.

Each report carries the rounds since the previous one (``HISTORY``) with the running
selection-rule value under ``OBJECTIVE``; the scheduler feeds every new round's value to the
shared state (rounds already seen are skipped: a function trainable's final result can be
delivered twice) and answers STOP on ``worse`` / ``plateau``.
"""

from __future__ import annotations

from typing import Any

from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from .tradeoff_search import PrunerStop, TradeoffState
from .trainable import HISTORY, OBJECTIVE, ROUND, TRIAL_KEY

__all__ = ["TradeoffScheduler"]


class TradeoffScheduler(FIFOScheduler):
    """Stops a trial when the strategy's stop rule says so (module docstring)."""

    def __init__(self, state: TradeoffState | PrunerStop) -> None:
        super().__init__()
        self.state = state
        self._seen: dict[int, int] = {}

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        number = int(trial.config[TRIAL_KEY])
        last = self._seen.get(number, 0)
        values = []
        for row in result.get(HISTORY, ()):
            if row[ROUND] <= last or row.get(OBJECTIVE) is None:
                continue
            values.append(float(row[OBJECTIVE]))
            last = int(row[ROUND])
        self._seen[number] = last
        if not values:
            return TrialScheduler.CONTINUE
        reason = self.state.observe(number, values)
        return TrialScheduler.STOP if reason else TrialScheduler.CONTINUE
