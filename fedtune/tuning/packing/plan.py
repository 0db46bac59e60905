"""How many configurations a study trains per trial process (``resources.pack``).

A *pack* is one Ray Tune trial that trains P configurations of the study at once with the
engine's :class:`~fedtune.trainers.packed.PackedTrainer`; each configuration stays its own
Optuna trial, MLflow child run and service trial (:mod:`fedtune.tuning.driver.pack_members` fans a pack's events out
to them). ``budget.max_concurrent`` counts configurations, never processes: a study trains
``max_concurrent`` configurations at once in ``ceil(max_concurrent / P)`` processes, each
holding ``resources`` (so GPUs are reserved per pack). Why and what was measured:
``docs/explanation/packing.md``.

``resources.pack``:

* ``1``: one configuration per process, as Ray Tune runs trials;
* an integer P ≥ 2: P configurations per process (at most ``budget.max_concurrent``);
* ``auto`` (the default): as many processes as the Ray cluster runs at once for the study's
  ``resources`` (its CPUs, or its GPUs for GPU trials), never more than ``max_concurrent``,
  and the concurrent configurations spread over them: P = ceil(max_concurrent / processes),
  at most :data:`AUTO_MAX` on CPUs; on a GPU at most :data:`MAX_PACK` and what fits the
  trial's GPU memory (:mod:`.memory`). On CPUs the pack is used only where it pays on the
  study's task, measured first (:mod:`.speed`); otherwise P = 1. A cluster with a free slot
  per configuration gets P = 1, measuring nothing.

On a GPU an integer ``pack`` that does not fit the trial's memory is refused with one line that
names the memory it needs (``ConfigError`` on ``resources.pack``).

A study whose algorithm cannot be packed (:func:`~fedtune.trainers.packed.pack_refusal`) runs
one configuration per process and says why in one line (:func:`plan`). Nothing here imports Ray,
and :func:`reserved_processes` (the service's reservations) imports nothing heavy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fedtune.errors import ConfigError

from .limits import AUTO, AUTO_MAX, MAX_PACK

if TYPE_CHECKING:
    from ..spec import StudySpec
    from .memory import PackMemory
    from .speed import PackSpeed

__all__ = ["ONE_PER_PROCESS", "PackPlan", "plan", "reserved_processes"]

#: the plan's line when nothing is packed and there was nothing to decide (``pack: 1``, or
#: ``auto`` with a process slot per configuration)
ONE_PER_PROCESS = "one configuration per trial process"


@dataclass(frozen=True)
class PackPlan:
    """A study's packing, resolved.

    Args:
        size: Configurations per trial process (1: not packed).
        processes: Trial processes at once (``ceil(max_concurrent / size)``).
        note: One line for the user: how the study packs, or why it does not.
    """

    size: int
    processes: int
    note: str

    @property
    def packed(self) -> bool:
        """Whether trials carry several configurations."""
        return self.size > 1


def refusal(spec: StudySpec) -> str | None:
    """Say why the study's configurations cannot share a process, if they cannot.

    Args:
        spec: The study (its algorithm registered: user code loaded).

    Returns:
        One line, or None when they can.
    """
    from fedtune.trainers.packed import pack_refusal  # torch: not for reserved_processes

    try:
        return pack_refusal(spec.base_config)
    except ConfigError as exc:  # validated elsewhere; an invalid base simply does not pack
        return str(exc)


def _slots(spec: StudySpec, cluster: Mapping[str, float]) -> int:
    """Trial processes the cluster runs at once for the study's per-process resources."""
    res = spec.resources
    if res.gpu > 0:
        return max(1, int(cluster.get("GPU", 0.0) // res.gpu))
    return max(1, int(cluster.get("CPU", 1.0) // res.cpu))


def plan(
    spec: StudySpec,
    cluster: Mapping[str, float] | None = None,
    memory: Callable[[], PackMemory | None] | None = None,
    speed: Callable[[int], PackSpeed | None] | None = None,
) -> PackPlan:
    """Resolve ``resources.pack`` for a run of the study.

    Args:
        spec: The study.
        cluster: Ray's ``cluster_resources()`` (``auto`` reads it; None: one process slot).
        memory: Measures a GPU pack's memory on a trial's GPU (called only for a GPU study
            that packs; None, or it returns None: not measured).
        speed: Measures a pack of the given size against its configurations one at a time
            on a trial's CPUs (called only for ``auto`` on CPUs with more than one
            configuration per slot; the study packs only when it pays, or when no ``speed`` is
            given).

    Returns:
        The pack size, the processes at once and the line that says so.

    Raises:
        ConfigError: ``resources.pack`` does not fit the trial's GPU memory.
    """
    concurrent = spec.budget.max_concurrent
    wanted = spec.resources.pack
    if wanted == 1:
        return PackPlan(1, concurrent, ONE_PER_PROCESS)
    gpu = spec.resources.gpu > 0 and spec.train.device != "cpu"  # trials compute on CUDA
    if wanted == AUTO:
        slots = min(concurrent, _slots(spec, cluster or {}))
        size = min(MAX_PACK if gpu else AUTO_MAX, math.ceil(concurrent / slots))
        how = f"auto, {slots} process slot{'s' if slots != 1 else ''}"
        if size == 1:  # a slot per configuration: nothing to pack, nothing to measure
            return PackPlan(1, concurrent, ONE_PER_PROCESS)
    why = refusal(spec)
    if why is not None:
        return PackPlan(1, concurrent, f"{ONE_PER_PROCESS}: {why}")
    measured = memory() if gpu and memory is not None else None
    if wanted == AUTO:
        if measured is not None and measured.fits() < size:
            size = max(1, measured.fits())
            how += f", at most {size} in the GPU's memory"
        elif not gpu and speed is not None:  # on CPUs a pack must pay on this task
            found = speed(size)
            how += f", {found.describe() if found else 'its speed not measured'}"
            size = size if found is not None and found.pays else 1
    else:
        size, how = int(wanted), f"resources.pack = {wanted}"
        why = measured.refusal(size) if measured is not None else None
        if why is not None:
            raise ConfigError("resources.pack", why)
    processes = math.ceil(concurrent / size)
    if size == 1:
        return PackPlan(1, concurrent, f"{ONE_PER_PROCESS} ({how})")
    return PackPlan(
        size,
        processes,
        f"{size} configurations per trial process, {processes} process"
        f"{'es' if processes != 1 else ''} at once ({how})",
    )


def reserved_processes(pack: int | str, max_concurrent: int) -> int:
    """The trial processes a study may hold at once, before its cluster is known.

    An integer pack gives ``ceil(max_concurrent / pack)``; ``auto`` may pick 1 on a large
    cluster, so it reserves as for one configuration per process.

    Args:
        pack: ``resources.pack``.
        max_concurrent: ``budget.max_concurrent``.

    Returns:
        The processes to reserve resources for.
    """
    if pack == AUTO or int(pack) <= 1:
        return max_concurrent
    return math.ceil(max_concurrent / int(pack))
