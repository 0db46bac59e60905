"""The driver's decisions for its packs: which members it stopped, which configurations join.

The driver and its packs share them through a :class:`Box`, the contract both sides are
written to: the driver notes stops and offers configurations (:meth:`Box.stop`,
:meth:`Box.offer`), a pack asks what was decided for it (:meth:`Box.ask`) and takes the answer
when it is there (:meth:`Box.ready`, :meth:`Box.result`). Two boxes keep it: :class:`RayBox`,
the handle of one :class:`PackBox` per packed study, a Ray actor that the driver writes and the
packs read, and :class:`LocalBox`, for packs in the driver's own process. This module imports
only the standard library (Ray when a :class:`RayBox` is used), so the actor's process costs a
bare Ray worker, not torch. The hand-off it carries is described in ``docs/explanation/packing.md``
(*Refilling*). The driver answers every report of a pack it refills (:meth:`PackBox.offer`);
the pack asks for that answer at each report and takes it at its next one
(:meth:`PackBox.answer`), and a pack with no member left waits for the answer to its last
report and ends only when it brings no configuration. A pack of one asks without waiting
(:meth:`PackBox.poll`): its stops only save compute.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

__all__ = ["Answer", "Box", "Decisions", "LocalBox", "PackBox", "RayBox"]

#: what the driver decided for a pack: ``(stopped, joining)``, the pack's members it stopped
#: and the configurations that join it
Answer = tuple[list[int], list[dict[str, Any]]]


class Box(Protocol):
    """The driver's decisions for its packs, as the driver writes them and a pack reads them.

    A question (:meth:`ask`) is answered by the box, not by the asker: the pack keeps it and
    reads the answer later, without waiting (:meth:`ready`) or waiting (:meth:`result`).
    """

    def stop(self, numbers: Sequence[int]) -> None:
        """Note members the driver stopped; returns at once.

        Args:
            numbers: Their Optuna numbers.
        """
        ...

    def offer(
        self, pack: str, configs: Sequence[dict[str, Any]], answers: int | None = None
    ) -> None:
        """Give a pack configurations to take, and answer one of its reports; returns at once.

        Args:
            pack: The pack's name (:func:`~fedtune.tuning.trials.results.pack_name`).
            configs: Member configs that join it (each with its Optuna number).
            answers: The pack's report (its ``round``) the driver has now processed.
        """
        ...

    def ask(self, pack: str, live: Sequence[int], report: int | None = None) -> object:
        """Ask what the driver decided for a pack; returns the question, to read later.

        Args:
            pack: The pack's name.
            live: Its members still training (as of now).
            report: The report whose answer is asked for: the answer comes once the driver
                answered it (:meth:`PackBox.answer`). None: what was decided so far
                (:meth:`PackBox.poll`).
        """
        ...

    def ready(self, question: object) -> bool:
        """Whether the answer to ``question`` is there (reading it would not wait)."""
        ...

    def result(self, question: object) -> Answer:
        """The answer to ``question`` (:data:`Answer`), waited for."""
        ...


class Decisions:
    """What the driver decided for its packs: the members it stopped and the configurations it
    offered each pack (the state :class:`PackBox` and :class:`LocalBox` keep)."""

    def __init__(self) -> None:
        self.stopped: set[int] = set()
        self.offers: dict[str, list[dict[str, Any]]] = {}  # pack -> configurations to take

    def stop(self, numbers: Sequence[int]) -> None:
        """Note members the driver stopped (their Optuna numbers)."""
        self.stopped.update(int(n) for n in numbers)

    def offer(self, pack: str, configs: Sequence[dict[str, Any]]) -> None:
        """Give a pack configurations to take."""
        self.offers.setdefault(pack, []).extend(configs)

    def poll(self, pack: str, live: Sequence[int]) -> Answer:
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
            pack: The pack's name (:func:`~fedtune.tuning.trials.results.pack_name`).
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


class RayBox(Box):
    """A :class:`Box` kept by a :class:`PackBox` actor: the driver's calls go to it without
    waiting (in order: Ray runs one caller's calls to an actor in the order they were made),
    a question is an object reference, read with ``ray.wait`` and ``ray.get``.

    It travels to the packs' processes with the trainable (its actor handle pickles).

    Args:
        actor: The study's :class:`PackBox` actor.
    """

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    @classmethod
    def start(cls) -> RayBox:
        """A box with a new :class:`PackBox` actor (no CPU of its own)."""
        import ray

        return cls(ray.remote(PackBox).options(num_cpus=0).remote())

    def stop(self, numbers: Sequence[int]) -> None:
        self.actor.stop.remote(list(numbers))

    def offer(
        self, pack: str, configs: Sequence[dict[str, Any]], answers: int | None = None
    ) -> None:
        self.actor.offer.remote(pack, list(configs), answers)

    def ask(self, pack: str, live: Sequence[int], report: int | None = None) -> object:
        if report is None:
            return self.actor.poll.remote(pack, list(live))
        return self.actor.answer.remote(pack, report, list(live))

    def ready(self, question: object) -> bool:
        import ray

        return bool(ray.wait([question], timeout=0)[0])

    def result(self, question: object) -> Answer:
        import ray

        stopped, joining = ray.get(question)
        return list(stopped), list(joining)


class LocalBox(Box):
    """A :class:`Box` for packs that run in the driver's own process
    (:mod:`fedtune.tuning.driver.in_process`): the same hand-off as :class:`RayBox`, without
    Ray.

    Such a pack's reports are processed by the driver before its ``report`` returns, so by the
    time the pack reads the answer to a report (at its next one, or when it has no member left)
    the driver has answered it: a question is answered when read, from what the driver has
    decided by then, which is what :meth:`PackBox.answer` waits for; it is always ready.
    """

    def __init__(self) -> None:
        self.decisions = Decisions()

    def stop(self, numbers: Sequence[int]) -> None:
        self.decisions.stop(numbers)

    def offer(
        self, pack: str, configs: Sequence[dict[str, Any]], answers: int | None = None
    ) -> None:
        self.decisions.offer(pack, configs)

    def ask(self, pack: str, live: Sequence[int], report: int | None = None) -> object:
        members = list(live)  # as asked: the pack's list goes on changing
        return lambda: self.decisions.poll(pack, members)

    def ready(self, question: object) -> bool:
        return True

    def result(self, question: object) -> Answer:
        return cast("Callable[[], Answer]", question)()  # what :meth:`ask` returned
