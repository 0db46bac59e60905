"""What a study's concurrent configurations cost as one pack in the driver's process against as
Ray Tune trials on this machine: the in-process choice by cost.

A study that trains ``max_concurrent`` ≥ 2 configurations at once on this machine's CPUs could
run them two ways. Through Ray, the machine's CPUs hold ``min(P, cores ÷ resources.cpu)``
trial processes at once, each training its configuration alone, and the study first pays Ray's
start and shutdown. In the driver's process, all P train at once in one
:class:`~fedtune.trainers.packed.PackedTrainer` on torch threads for the CPUs those processes
would hold, and nothing starts. Which is cheaper depends on the task: a round that is mostly
per-round overhead (the quadratic, LEAF's small models) packs several times faster than one at a
time; a round that is mostly arithmetic (a CNN) does not, and the processes' parallelism wins
once the study is long enough to pay Ray's start.

:func:`estimate` measures both speeds on the study's task in this process (:func:`.speed.measure`:
two configurations one at a time with the trial's threads, the pack of P on one thread and on
the threads of the CPUs Ray's processes would hold, the more threads kept only where they run
:data:`WIDER` times as fast: small kernels and a busy machine can make more threads much
slower), and
:func:`weigh` turns them into seconds for the study's work — its configuration-rounds: trials ×
rounds × seeds, at most ``budget.configuration_rounds`` × seeds; for a study bounded only by
``budget.time``, what the pack trains in that time:

* in this process: ``work ÷ packed rate``;
* through Ray: :data:`RAY_START_S` × ``slowdown`` + ``work ÷ (alone rate × processes at
  once)``.

Both rates are timed in wall seconds on this machine as busy as it is now, while
:data:`RAY_START_S` was measured on a quiet one: ``slowdown`` (:attr:`.speed.PackSpeed.slowdown`,
the one-at-a-time rounds' wall time over their CPU time) puts Ray's start in the same terms.
Without it a busy machine made the pack look dearer and Ray's start no dearer, and sent a study
through Ray that costs less here (the quick start at a load of 12 on 2 CPUs: an estimated 21 s
here against 21 s through Ray, against 4.8 s and 13 s at a load of 1).

The pack runs here when its estimate is no more than Ray's. Schedulers that stop trials early
shorten both sides alike. :data:`RAY_START_S` is measured, not guessed: the whole-process
benchmark's ``fedtune tune --ray`` against the same study in the driver's process
(``benchmarks/startup.py --whole``; ``docs/explanation/architecture.md``, *Trials in the
driver's process*).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .speed import PackSpeed, measure

if TYPE_CHECKING:
    from ..spec import StudySpec

__all__ = ["ALONE", "RAY_START_S", "WIDER", "ProcessCost", "estimate", "study_work", "weigh"]

#: seconds a study pays for an embedded Ray: its start, the trial processes' start and Ray's
#: shutdown (``fedtune tune --ray`` − in the driver's process on the whole-process benchmark,
#: 9–12 s on a 2-CPU machine; the lower end, so that a pack is chosen only where it is cheaper)
RAY_START_S = 9.0
#: configurations timed one at a time by :func:`estimate` (the rest of the pack's draws are not)
ALONE = 2
#: how many times as fast a pack must run on more threads than on one to get them: threads
#: that wait for each other lose much more on a busy machine than they gain on a quiet one (the
#: quick start's pack of 2 ran 1.15–1.37× as fast on two threads at a load of 1, 13× slower at 8)
WIDER = 1.5


@dataclass(frozen=True)
class ProcessCost:
    """A study's estimated seconds in the driver's process and through Ray.

    Args:
        threads: Torch threads of the pack in this process.
        here_s: Estimated seconds as one pack in this process (None: not estimated).
        ray_s: Estimated seconds as Ray Tune trials, Ray's start included (None: not
            estimated).
        why: Why it was not estimated.
    """

    threads: int
    here_s: float | None
    ray_s: float | None
    why: str = ""

    @property
    def here(self) -> bool:
        """Whether the pack in this process costs no more than Ray (False: not estimated)."""
        return self.here_s is not None and self.ray_s is not None and self.here_s <= self.ray_s

    def describe(self) -> str:
        """The estimate in a few words (the study's ``packing`` line)."""
        if self.here_s is None or self.ray_s is None:
            return f"not estimated: {self.why}" if self.why else "not estimated"
        return (
            f"estimated {_seconds(self.here_s)} in this process against "
            f"{_seconds(self.ray_s)} through Ray, its start included"
        )


def _seconds(s: float) -> str:
    return f"{s:.2g} s" if s < 10 else f"{s:.0f} s"


def study_work(spec: StudySpec, target: int | None) -> int | None:
    """The configuration-rounds a study trains at most (None: bounded by time only).

    Args:
        spec: The study.
        target: The trials it is to have (None: no limit in trials).

    Returns:
        Trials × rounds (at most ``budget.configuration_rounds``) × seeds.
    """
    limits = [n for n in (spec.budget.configuration_rounds,) if n is not None]
    if target is not None:
        limits.append(target * spec.train.rounds)
    if not limits:
        return None
    return min(limits) * len(spec.trial_seeds())


def weigh(
    speed: PackSpeed,
    *,
    work: int | None,
    time_s: float | None,
    processes: int,
    threads: int,
) -> ProcessCost:
    """Both estimates of a study from its measured speeds (see the module docstring).

    Args:
        speed: The pack's and one configuration's configuration-rounds per second.
        work: The study's configuration-rounds (None: bounded by ``time_s`` only).
        time_s: Its ``budget.time`` (used when ``work`` is None).
        processes: Trial processes Ray would run at once on this machine.
        threads: The pack's torch threads in this process.

    Returns:
        The estimates (none, with the reason, when a speed or the work is unknown).
    """
    if not speed.packed or not speed.unpacked:
        return ProcessCost(threads, None, None, speed.why or "no round to time")
    if work is None and time_s is None:
        return ProcessCost(threads, None, None, "no budget in trials or rounds")
    work_f = float(work) if work is not None else speed.packed * float(time_s or 0.0)
    here = work_f / speed.packed
    ray = RAY_START_S * speed.slowdown + work_f / (speed.unpacked * max(1, processes))
    return ProcessCost(threads, here, ray)


def estimate(spec: StudySpec, *, size: int, target: int | None, cores: int) -> ProcessCost:
    """Measure the study's task in this process and weigh both ways of running it.

    Args:
        spec: The study (its algorithm packs, its trials on the CPU; its code loaded).
        size: Configurations at once (``budget.max_concurrent``).
        target: The trials it is to have (None: no limit in trials).
        cores: This machine's CPUs.

    Returns:
        The estimates.
    """
    cpu = max(1, int(spec.resources.cpu))
    processes = min(size, max(1, cores // cpu))
    threads = min(cores, processes * cpu)
    # more threads are not always faster (small kernels, a busy machine): both are timed
    speed = measure(spec, size, packed_threads=sorted({1, threads}), alone=ALONE, margin=WIDER)
    return weigh(
        speed,
        work=study_work(spec, target),
        time_s=spec.budget.time,
        processes=processes,
        threads=speed.threads or 1,
    )
