"""How a pack trains its members: a :class:`PackRuns`, the contract the pack's loop
(:func:`~fedtune.tuning.trials.trainable.train_pack`) is written to, whatever trains them.

Two runs keep it. A pack of one trains with the engine's own
:class:`~fedtune.trainers.Trainer` per seed, in lockstep (:class:`Single`); a larger pack
trains every member and seed as rows of one :class:`~fedtune.trainers.packed.PackedTrainer`
(:class:`Packed`), and takes refills. Either way a member's record each round is the mean over
its seeds (:func:`seed_mean`).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from fedtune.errors import FedtuneError
from fedtune.trainers import Outcome, Trainer, TrialConfig

from ..keys import ROUND

__all__ = ["PackRuns", "Packed", "Single", "open_runs", "seed_mean"]


class PackRuns(Protocol):
    """A pack's members in training, by Optuna number: stepped together, each ending by itself
    (completed, diverged) or stopped by the driver."""

    @property
    def refills(self) -> bool:
        """Whether members may join while it trains (:meth:`add`)."""
        ...

    def step(self) -> dict[int, dict[str, Any] | None]:
        """One round of every live member: its mean record over its seeds, None when a seed
        diverged (the member has ended)."""
        ...

    def done(self, number: int) -> bool:
        """Whether member ``number`` trained its last round."""
        ...

    def decays(self, number: int) -> float:
        """The learning-rate decays of member ``number`` so far (the mean over its seeds)."""
        ...

    def reason(self, number: int) -> str:
        """Why member ``number`` diverged ("" when it did not)."""
        ...

    def stop(self, number: int) -> None:
        """End member ``number`` (the driver stopped it): it trains no more."""
        ...

    def add(self, number: int, configs: list[TrialConfig]) -> None:
        """A member that joins (a refill): its seeds start at round 0 at the next step.

        Args:
            number: Its Optuna number.
            configs: Its configuration, one per seed.
        """
        ...


def seed_mean(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One round's record of a trial trained with several seeds: the mean of each field every
    seed has (one seed: its record as it is)."""
    if len(rows) == 1:
        return rows[0]
    keys = [k for k in rows[0] if all(k in r for r in rows)]
    mean = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    mean[ROUND] = rows[0][ROUND]
    return mean


def open_runs(members: dict[int, list[TrialConfig]]) -> PackRuns:
    """The runs of a pack's first members (:class:`Single` for one, else :class:`Packed`).

    Args:
        members: Each member's configuration per seed, by number.

    Returns:
        The pack's runs, before its first step.
    """
    if len(members) == 1:
        ((number, configs),) = members.items()
        return Single(number, configs)
    return Packed(members)


class Single(PackRuns):
    """A pack of one: its configuration trained by the engine's own trainers, one per seed,
    stepped in lockstep (the task's data built once and shared); never refilled."""

    refills = False

    def __init__(self, number: int, configs: list[TrialConfig]) -> None:
        first = Trainer(configs[0])
        self.number = number
        self.trainers = [first] + [Trainer(c, task=first.task) for c in configs[1:]]

    def step(self) -> dict[int, dict[str, Any] | None]:
        """The member's mean record over its seeds, None when a seed diverged."""
        rows = []
        for trainer in self.trainers:
            record = trainer.step()
            if record is None:
                return {self.number: None}
            rows.append(record.as_dict())
        return {self.number: seed_mean(rows)}

    def done(self, number: int) -> bool:
        return any(t.done for t in self.trainers)

    def decays(self, number: int) -> float:
        return sum(t.decay.decays for t in self.trainers) / len(self.trainers)

    def reason(self, number: int) -> str:
        return next((t.reason for t in self.trainers if t.outcome == Outcome.DIVERGED), "")

    def stop(self, number: int) -> None:
        return None  # its trial is stopped by the tuner: nothing to save

    def add(self, number: int, configs: list[TrialConfig]) -> None:
        raise FedtuneError("a pack of one takes no refills")


class Packed(PackRuns):
    """Every member and seed in one :class:`PackedTrainer` (members × seeds rows)."""

    refills = True

    def __init__(self, members: dict[int, list[TrialConfig]]) -> None:
        from fedtune.trainers.packed import PackedTrainer

        self.index: dict[int, list[int]] = {}
        flat: list[TrialConfig] = []
        for number, configs in members.items():
            self.index[number] = list(range(len(flat), len(flat) + len(configs)))
            flat.extend(configs)
        self.trainer = PackedTrainer(flat)
        self.rounds = {n: c[0].train.rounds for n, c in members.items()}
        self._ended: set[int] = set()

    def add(self, number: int, configs: list[TrialConfig]) -> None:
        """A member that joins (a refill): its seeds start at round 0 at the next step."""
        self.index[number] = [self.trainer.add(c) for c in configs]
        self.rounds[number] = configs[0].train.rounds

    def step(self) -> dict[int, dict[str, Any] | None]:
        """Each live member's mean record this round, None for one that diverged."""
        records = self.trainer.step()
        out: dict[int, dict[str, Any] | None] = {}
        for number, rows in self.index.items():
            if number in self._ended:
                continue
            got = [r for r in (records[i] for i in rows) if r is not None]
            if len(got) == len(rows):
                out[number] = seed_mean([r.as_dict() for r in got])
                if got[0].round >= self.rounds[number]:
                    self._ended.add(number)
            else:  # a seed diverged: the member ends as diverged (as in :class:`Single`)
                out[number] = None
                self.stop(number)
        return out

    def done(self, number: int) -> bool:
        return number in self._ended

    def decays(self, number: int) -> float:
        rows = self.index[number]
        return sum(self.trainer.decays(i) for i in rows) / len(rows)

    def reason(self, number: int) -> str:
        return next(
            (
                why
                for i in self.index[number]
                for outcome, why in [self.trainer.outcome(i)]
                if outcome == Outcome.DIVERGED
            ),
            "",
        )

    def stop(self, number: int) -> None:
        self._ended.add(number)
        for i in self.index[number]:
            if self.trainer.outcome(i)[0] is None:
                self.trainer.stop(i)
