"""Whether packing pays on a study's task: ``resources.pack: auto`` on CPUs measures it first.

A pack makes a configuration-round cheaper only where a round of one configuration is mostly
per-round overhead (sampling the cohort, the Python of the round, small kernels), which a pack
pays once for P configurations. Where a round is mostly arithmetic (a CNN, a wide MLP on one
thread) the pack runs the same arithmetic, and its masked steps and larger working set make it
slower: on the search suite a pack of 8 ran 3.5 to 7 times faster than the same configurations
one after another on the quadratic and LEAF tasks, and 0.7 to 0.9 times as fast on the digits
MLP and CNN (``docs/explanation/search-strategies.md``). So ``auto`` measures before it packs.

:func:`measure` draws P configurations of the study's search space (Optuna's random sampler,
seeded), builds the task once, and times :data:`ROUNDS` rounds of each side after one round
that is not timed (the trainer's set-up and first-call costs, paid per trial unpacked and
once per pack packed: leaving them out favours the unpacked side):

* **one at a time**: each configuration by the engine's :class:`~fedtune.trainers.engine.Trainer`,
  as a pack of one trains it;
* **packed**: all P in one :class:`~fedtune.trainers.packed.PackedTrainer`.

Each side's figure is configuration-rounds run per second (a configuration that diverges stops
on both sides); the pack pays when it runs at least :data:`PAYS` times as many
(:attr:`PackSpeed.pays`). A round of one configuration that takes :data:`SLOW_ROUND_S` or more
is arithmetic, not overhead: the pack is not timed and does not pay. The probe runs with the
trial's ``resources.cpu`` torch threads, as a Ray task holding a trial's resources
(:func:`measure_on_cluster`), so the CPU measured is one a trial would get.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .probe import on_a_trials_resources

if TYPE_CHECKING:
    from fedtune.trainers.config import TrialConfig

    from ..spec import StudySpec

__all__ = ["PAYS", "ROUNDS", "SLOW_ROUND_S", "PackSpeed", "measure", "measure_on_cluster"]

#: how many times as many configuration-rounds per second a pack must run to be used
PAYS = 2.0
#: rounds timed on each side (after one untimed round)
ROUNDS = 3
#: a round of one configuration that takes this long is arithmetic: not probed further
SLOW_ROUND_S = 1.0


@dataclass(frozen=True)
class PackSpeed:
    """A pack's speed on the study's task against its configurations one at a time.

    Args:
        size: Configurations in the pack.
        packed: Configuration-rounds per second packed (None: not timed).
        unpacked: Configuration-rounds per second one at a time (None: not timed).
        why: Why a side was not timed.
        threads: The torch threads of the pack's figure (None: not timed).
        slowdown: The one-at-a-time rounds' wall time ÷ their thread's CPU time (on one torch
            thread): how many times slower than an idle CPU this machine runs now (1.0: not
            measured, or more than one thread).
    """

    size: int
    packed: float | None
    unpacked: float | None
    why: str = ""
    threads: int | None = None
    slowdown: float = 1.0

    @property
    def speedup(self) -> float | None:
        """Packed ÷ one at a time (None: a side was not timed)."""
        if not self.packed or not self.unpacked:
            return None
        return self.packed / self.unpacked

    @property
    def pays(self) -> bool:
        """Whether the pack runs at least :data:`PAYS` times as many configuration-rounds."""
        return self.speedup is not None and self.speedup >= PAYS

    def describe(self) -> str:
        """What was measured, in a few words (the plan's line)."""
        if self.speedup is None:
            return self.why or "nothing to time after the first round"
        return (
            f"a pack of {self.size} measured {self.speedup:.2f}× the configuration-rounds/s of "
            f"one at a time ({'≥' if self.pays else '<'} {PAYS:g}×)"
        )


def draws(spec: StudySpec, size: int, seed: int = 0) -> list[TrialConfig]:
    """``size`` configurations of the study's space that share one pack, drawn at random.

    Args:
        spec: The study (its algorithm packs).
        size: How many.
        seed: The random sampler's seed.

    Returns:
        Up to ``size`` configurations with the first one's pack key (at most ``4 · size`` draws).
    """
    import optuna

    from fedtune.search_spaces.optuna_adapter import suggest
    from fedtune.trainers.pack_rules import pack_key

    space = spec.search_space()
    sampler = optuna.samplers.RandomSampler(seed=seed)
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "a new study created" line
    try:
        study = optuna.create_study(sampler=sampler, storage=optuna.storages.InMemoryStorage())
    finally:
        optuna.logging.set_verbosity(verbosity)
    configs: list[TrialConfig] = []
    for _ in range(4 * size):
        config = spec.trial(suggest(study.ask(), space))
        if not configs or pack_key(config) == pack_key(configs[0]):
            configs.append(config)
        if len(configs) == size:
            break
    return configs


def _timed(step: Any, done: Any, rounds: int = 1) -> tuple[int, float, float]:
    """Configuration-rounds run, seconds taken and this thread's CPU-seconds spent by up to
    ``rounds`` steps."""
    ran, start, cpu = 0, time.perf_counter(), time.thread_time()
    for _ in range(rounds):
        if done():
            break
        ran += step()
    return ran, time.perf_counter() - start, time.thread_time() - cpu


def _slowdown(wall: float, cpu: float, threads: int) -> float:
    """Wall ÷ CPU time of rounds on one torch thread, at least 1 (1.0 for more threads, whose
    work is not all on the timing thread, or nothing timed)."""
    return max(1.0, wall / cpu) if threads == 1 and cpu > 0 else 1.0


def measure(
    spec: StudySpec,
    size: int,
    seed: int = 0,
    *,
    packed_threads: Sequence[int] = (),
    alone: int | None = None,
    margin: float = 1.0,
) -> PackSpeed:
    """Measure a pack of ``size`` on the study's task (see the module docstring).

    Args:
        spec: The study (its algorithm packs, its trials on the CPU).
        size: Configurations in the pack.
        seed: The seed of the configurations' draw.
        packed_threads: Torch thread counts to time the pack with, the fastest kept (empty:
            the trial's ``resources.cpu``, as one at a time).
        alone: How many of the configurations are timed one at a time (None: all).
        margin: A thread count of ``packed_threads`` is kept over an earlier one only when its
            pack runs this many times as many configuration-rounds per second.

    Returns:
        Both sides' configuration-rounds per second.
    """
    import torch

    from fedtune.trainers.engine import Trainer
    from fedtune.trainers.packed import PackedTrainer

    configs = [
        dataclasses.replace(c, train=dataclasses.replace(c.train, device="cpu"))
        for c in draws(spec, size, seed)
    ]
    rounds = min(ROUNDS, max(1, configs[0].train.rounds - 1))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(spec.resources.cpu)))
    try:
        first = Trainer(configs[0])
        ran, took, spent = 0, 0.0, 0.0
        for config in configs[:alone]:
            trainer = first if config is configs[0] else Trainer(config, task=first.task)
            trainer.step()  # set-up and first calls: not timed
            for _ in range(rounds):
                n, s, c = _timed(
                    lambda t=trainer: int(t.step() is not None), lambda t=trainer: t.done
                )
                ran, took, spent = ran + n, took + s, spent + c
                if n and s >= SLOW_ROUND_S:
                    why = f"a round of one configuration took {s:.1f} s: arithmetic, not overhead"
                    return PackSpeed(len(configs), None, None, why)
        best: tuple[float | None, int | None] = (None, None)
        for count in packed_threads or (int(spec.resources.cpu),):
            torch.set_num_threads(max(1, count))
            pack = PackedTrainer(configs, task=first.task)
            pack.step()
            n, s, _ = _timed(
                lambda p=pack: sum(r is not None for r in p.step()), lambda p=pack: p.done, rounds
            )
            if (_rate(n, s) or 0.0) > (best[0] or 0.0) * (margin if best[0] else 1.0):
                best = (_rate(n, s), max(1, count))
    finally:
        torch.set_num_threads(threads)
    slowdown = _slowdown(took, spent, max(1, int(spec.resources.cpu)))
    return PackSpeed(len(configs), best[0], _rate(ran, took), threads=best[1], slowdown=slowdown)


def _rate(ran: int, seconds: float) -> float | None:
    return ran / seconds if ran and seconds > 0 else None


def measure_on_cluster(spec: StudySpec, size: int) -> PackSpeed | None:
    """:func:`measure` as a Ray task holding one trial's ``resources`` (Ray is up).

    Args:
        spec: The study.
        size: Configurations in the pack.

    Returns:
        The measured speeds; None when they could not be measured (logged in one line: the
        study then does not pack).
    """
    return on_a_trials_resources(measure, spec, size, gpu=0, what="the pack's speed")
