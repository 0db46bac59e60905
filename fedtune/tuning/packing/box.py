"""The driver's decisions for its packs: which members it stopped, which configurations join.

One :class:`PackBox` per packed study, a Ray actor (``ray.remote(PackBox)``) that the driver
writes and the packs read. It imports only the standard library, so its process costs a bare
Ray worker, not torch. The hand-off it carries is described in ``docs/explanation/packing.md``
(*Refilling*). The driver answers every report of a pack it refills (:meth:`PackBox.offer`);
the pack asks for that answer at each report and takes it at its next one
(:meth:`PackBox.answer`), and a pack with no member left waits for the answer to its last
report and ends only when it brings no configuration. A pack of one asks without waiting
(:meth:`PackBox.poll`): its stops only save compute.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

__all__ = ["Decisions", "LocalBox", "LocalRef", "PackBox"]


class Decisions:
    """What the driver decided for its packs: the members it stopped and the configurations it
    offered each pack (the state :class:`PackBox` and :class:`LocalBox` share)."""

    def __init__(self) -> None:
        self.stopped: set[int] = set()
        self.offers: dict[str, list[dict[str, Any]]] = {}  # pack -> configurations to take

    def stop(self, numbers: Sequence[int]) -> None:
        """Note members the driver stopped (their Optuna numbers)."""
        self.stopped.update(int(n) for n in numbers)

    def offer(self, pack: str, configs: Sequence[dict[str, Any]]) -> None:
        """Give a pack configurations to take."""
        self.offers.setdefault(pack, []).extend(configs)

    def poll(self, pack: str, live: Sequence[int]) -> tuple[list[int], list[dict]]:
        """``(stopped, joining)``: those of ``live`` the driver stopped, and the configurations
        offered since the last call (they are the pack's now)."""
        return [n for n in live if n in self.stopped], self.offers.pop(pack, [])


class PackBox:
    """Stops and refills, from the driver to the packs (an asyncio Ray actor)."""

    def __init__(self) -> None:
        self._decisions = Decisions()
        self._answered: dict[str, int] = {}  # pack -> the last report the driver answered
        self._changed = asyncio.Condition()

    async def stop(self, numbers: Sequence[int]) -> None:
        """Note members the driver stopped.

        Args:
            numbers: Their Optuna numbers.
        """
        self._decisions.stop(numbers)

    async def offer(
        self, pack: str, configs: Sequence[dict[str, Any]], answers: int | None = None
    ) -> None:
        """Give a pack configurations to take, and answer one of its reports.

        Args:
            pack: The pack's name (:func:`~.trial.pack_name`).
            configs: Member configs that join it (each with its Optuna number).
            answers: The pack's report (its ``round``) the driver has now processed: its stops
                and these configurations are the answer to it.
        """
        async with self._changed:
            self._decisions.offer(pack, configs)
            if answers is not None:
                self._answered[pack] = max(answers, self._answered.get(pack, -1))
            self._changed.notify_all()

    async def poll(self, pack: str, live: Sequence[int]) -> tuple[list[int], list[dict]]:
        """What the driver decided for a pack so far, without waiting.

        Args:
            pack: The pack's name.
            live: Its members still training.

        Returns:
            ``(stopped, joining)``: those of ``live`` the driver stopped, and the configurations
            offered since the last call (they are the pack's now).
        """
        return self._decisions.poll(pack, live)

    async def answer(
        self, pack: str, report: int, live: Sequence[int]
    ) -> tuple[list[int], list[dict]]:
        """What the driver decided for a pack at one of its reports, once it has decided.

        Args:
            pack: The pack's name.
            report: The report's ``round``.
            live: The pack's members still training.

        Returns:
            As :meth:`poll`, once the driver has answered ``report``.
        """
        async with self._changed:
            await self._changed.wait_for(lambda: self._answered.get(pack, -1) >= report)
            return self._decisions.poll(pack, live)


class LocalRef:
    """A question to a :class:`LocalBox`, answered when read (as ``ray.get`` reads a Ray
    object reference).

    Args:
        answer: Gives the answer.
    """

    def __init__(self, answer: Any) -> None:
        self._answer = answer

    def get(self) -> tuple[list[int], list[dict]]:
        """The answer, as of now."""
        return self._answer()


class _Local:
    """One of a :class:`LocalBox`'s methods, called as an actor's is (``.remote(...)``)."""

    def __init__(self, call: Any) -> None:
        self.remote = call


class LocalBox:
    """Stops and refills for packs that run in the driver's own process
    (:mod:`fedtune.tuning.driver.in_process`): the same hand-off as :class:`PackBox`, without a
    Ray actor.

    Such a pack's reports are processed by the driver before its ``report`` returns, so by the
    time the pack reads the answer to a report (at its next one, or when it has no member left)
    the driver has answered it: a question is answered when read (:class:`LocalRef`), from what
    the driver has decided by then, which is what :meth:`PackBox.answer` waits for.
    """

    def __init__(self) -> None:
        decisions = Decisions()
        self._decisions = decisions
        self.stop = _Local(decisions.stop)
        self.offer = _Local(lambda pack, configs, answers=None: decisions.offer(pack, configs))
        self.poll = _Local(self._ask)
        self.answer = _Local(lambda pack, report, live: self._ask(pack, live))

    def _ask(self, pack: str, live: Sequence[int]) -> LocalRef:
        members = list(live)  # as sent: the pack's list goes on changing
        return LocalRef(lambda: self._decisions.poll(pack, members))
