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

__all__ = ["PackBox"]


class PackBox:
    """Stops and refills, from the driver to the packs (an asyncio Ray actor)."""

    def __init__(self) -> None:
        self._stopped: set[int] = set()
        self._offers: dict[str, list[dict[str, Any]]] = {}  # pack -> configurations to take
        self._answered: dict[str, int] = {}  # pack -> the last report the driver answered
        self._changed = asyncio.Condition()

    async def stop(self, numbers: Sequence[int]) -> None:
        """Note members the driver stopped.

        Args:
            numbers: Their Optuna numbers.
        """
        self._stopped.update(int(n) for n in numbers)

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
            self._offers.setdefault(pack, []).extend(configs)
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
        return [n for n in live if n in self._stopped], self._offers.pop(pack, [])

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
            return await self.poll(pack, live)
