"""A study's budget in configuration-rounds (``budget.configuration_rounds``), driver side.

A *configuration-round* is one round of one configuration, packed or not: the unit of compute
a study spends. The budget is never exceeded. Each configuration may train ``train.rounds``
rounds, so a new one starts only while

    spent + Σ over running configurations of train.rounds  +  train.rounds  ≤  budget

where *spent* counts the rounds of every configuration that has ended, in this session or an
earlier one (Optuna's ``rounds`` user attribute), and a running configuration holds its whole
``train.rounds`` until it ends. A configuration stopped early (a stopper, a divergence) gives
back what it did not use, so stopping bad configurations early buys more of them. When a new
configuration does not fit, the searcher waits while others run (their end may free enough)
and finishes when none runs. Every configuration, whatever its pack, goes through
:meth:`RoundBudget.ask` (:mod:`.search`, :mod:`fedtune.tuning.driver.pack_members`); the progress line reads
:attr:`RoundBudget.used`.

Pure bookkeeping: no Ray, no Optuna.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable
from typing import Any

__all__ = ["Ask", "RoundBudget", "rounds_spent"]


class Ask(enum.StrEnum):
    """What :meth:`RoundBudget.ask` allows now."""

    GO = "go"  # start a configuration
    WAIT = "wait"  # not now: running configurations may free enough
    DONE = "done"  # never: nothing runs and what is left cannot hold a configuration


class RoundBudget:
    """Configuration-rounds spent, held by running configurations, and left.

    Args:
        limit: ``budget.configuration_rounds``.
        rounds: ``train.rounds``: what one configuration may train.
        spent: Rounds of the configurations that ended before this session.
    """

    def __init__(self, limit: int, rounds: int, spent: int = 0) -> None:
        if limit < 1 or rounds < 1 or spent < 0:
            raise ValueError(f"limit {limit}, rounds {rounds}, spent {spent}")
        self.limit, self.rounds, self.spent = int(limit), int(rounds), int(spent)
        self._running: dict[Hashable, int] = {}  # configuration -> rounds trained so far

    @property
    def used(self) -> int:
        """Rounds trained so far: ended configurations and the running ones' rounds."""
        return self.spent + sum(self._running.values())

    @property
    def held(self) -> int:
        """Rounds spent or held: ended configurations, and ``rounds`` per running one."""
        return self.spent + self.rounds * len(self._running)

    @property
    def left(self) -> int:
        """Rounds not yet trained (what the progress line shows)."""
        return max(0, self.limit - self.used)

    def ask(self) -> Ask:
        """Whether a new configuration may start now (see the module docstring)."""
        if self.held + self.rounds <= self.limit:
            return Ask.GO
        return Ask.WAIT if self._running else Ask.DONE

    def start(self, key: Hashable) -> None:
        """A configuration started (after :meth:`ask` said ``GO``): it holds ``rounds``."""
        self._running.setdefault(key, 0)

    def trained(self, key: Hashable, round_: int) -> None:
        """A running configuration reported its round ``round_`` (1-based, cumulative)."""
        if key in self._running:
            self._running[key] = max(self._running[key], min(int(round_), self.rounds))

    def end(self, key: Hashable, round_: int | None = None) -> None:
        """A configuration ended after ``round_`` rounds (None: its last report's); what it
        held beyond them is free again."""
        trained = self._running.pop(key, None)
        if trained is None:
            return
        if round_ is not None:
            trained = max(trained, min(int(round_), self.rounds))
        self.spent += trained


def rounds_spent(trials: Iterable[Any]) -> int:
    """Rounds the ended configurations of earlier sessions trained.

    Args:
        trials: Optuna's finished trials (``FrozenTrial``): the ``rounds`` user attribute its
            end recorded, else (interrupted by a crash) its last reported step.

    Returns:
        Their sum.
    """
    total = 0
    for trial in trials:
        rounds = trial.user_attrs.get("rounds")
        if rounds is None:
            rounds = max(trial.intermediate_values, default=0)
        total += int(rounds)
    return total
