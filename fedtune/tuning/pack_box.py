"""The driver's decisions for its packs: which members it stopped, which configurations join.

One :class:`PackBox` per packed study, a Ray actor (``ray.remote(PackBox)``) that the driver
writes and the packs read. It imports only the standard library, so its process costs a bare
Ray worker, not torch. The hand-off it carries is described in ``docs/explanation/packing.md``
(*Refilling*): a pack asks at its reports without waiting (:meth:`PackBox.poll`); a pack with no
member left waits for the driver's answer to its last report (:meth:`PackBox.wait`) and ends
only when that answer brings no configuration.
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
        """Give a pack configurations to take, or answer the report it waits on.

        Args:
            pack: The pack's name (:func:`~.pack_trial.pack_name`).
            configs: Member configs that join it (each with its Optuna number).
            answers: The pack's report (its ``round``) this answers: the pack had no member
                left then, and ends unless ``configs`` (or an earlier offer) has some.
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

    async def wait(self, pack: str, report: int) -> list[dict[str, Any]]:
        """The configurations that join a pack with no member left, once the driver answered.

        Args:
            pack: The pack's name.
            report: Its last report's ``round``.

        Returns:
            The configurations offered and not yet taken (none: the pack ends).
        """
        async with self._changed:
            await self._changed.wait_for(lambda: self._answered.get(pack, -1) >= report)
            return self._offers.pop(pack, [])
