"""The study's scheduler (Ray Tune's or the in-process tuner's): it stops configurations when
the study's stopper says so.

Every trial is a pack of P ≥ 1 configurations (:mod:`fedtune.tuning.packing`). After each of a
pack's reports, :class:`PackScheduler` hands every member's new rounds to the study's
:class:`~.stop_rules.Stopper` (:class:`RoundFeed`). A stopped member's own trial ends at that
report: the callbacks and the searcher hear so (``PackBook.stopped``), and the pack leaves it out
from the next round on, told through the study's :class:`~fedtune.tuning.packing.box.Box`.
A pack whose last members were stopped at a report (a pack of one whose configuration was
stopped) is stopped by Tune there; a pack whose members ended by themselves (completed,
diverged) ends itself, and one that takes refills ends when the searcher's answer brings no
configuration.

Ray Tune's own schedulers (ASHA, the median stopping rule) stop whole trials and cannot stop one
member of a pack; ``asha`` and ``median`` are Optuna's pruners over the same rounds
(:class:`~.stop_rules.PrunerStopper`), for every study, packed or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from fedtune.outcomes import RUNNING

from ..keys import HISTORY, OBJECTIVE, OUTCOME, ROUND, TRIAL_KEY
from ..tune_hooks import Scheduler
from .results import MEMBERS
from .stop_rules import Stopper, StopReason

if TYPE_CHECKING:
    from ..driver.pack_members import PackBook
    from ..packing.box import Box
    from .view import TrialView

__all__ = ["PackScheduler", "RoundFeed"]


class RoundFeed:
    """Hands a stopper each trial's new rounds, once.

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


class PackScheduler(Scheduler):
    """Stops a pack's members when the study's stopper says so (module docstring).

    Args:
        stopper: The study's stopper (:func:`.stoppers.stopper_for`).
        book: The driver's :class:`~fedtune.tuning.driver.pack_members.PackBook`.
        box: The :class:`~fedtune.tuning.packing.box.Box` the packs read (None: no pack
            hears of a stop until its trial is stopped).
    """

    def __init__(self, stopper: Stopper, book: PackBook, box: Box | None) -> None:
        self.stopper, self.book, self.box = stopper, book, box
        self.feed = RoundFeed(stopper)
        self._ended: set[int] = set()

    def on_trial_result(self, tune_controller: Any, trial: TrialView, result: dict) -> str:
        stopped = []
        for member in result.get(MEMBERS, ()):
            number = int(member[TRIAL_KEY])
            if number in self._ended:
                continue
            if member.get(OUTCOME, RUNNING) != RUNNING:
                self._ended.add(number)
                continue
            if self._observe(number, member):
                stopped.append(number)
                self._ended.add(number)
        if stopped:
            self.book.stopped.update(stopped)
            if self.box is not None:
                self.box.stop(stopped)
        if trial.trial_id in self.book.refilled:
            return Scheduler.CONTINUE  # it ends when the searcher's answer brings no one
        numbers = self.book.numbers(trial.trial_id, trial.config)
        if stopped and all(n in self._ended for n in numbers):
            return Scheduler.STOP  # its last members were stopped here: it cannot know yet
        return Scheduler.CONTINUE  # members that end by themselves: the pack ends itself

    def _observe(self, number: int, member: Mapping[str, Any]) -> bool:
        return self.feed.observe(number, member.get(HISTORY, ())) is not None
