"""How many configurations fit one GPU's memory: ``resources.pack`` of a GPU study.

A pack's device memory grows linearly with its size P: the task's data, the model and the
kernels' workspace are paid once (*base*), and every configuration adds its stacked parameters,
server state, its M clients' copies and gradients and their activations (*per member*; a GPU
pack vmaps all members at once). Both are measured, not estimated: :func:`measure` runs one
round of a pack of 1 and of :data:`PROBE` configurations of the study on the trial's GPU and
reads the allocator's peak (``torch.cuda.max_memory_allocated``) after each. The memory a trial
may use is the device's free memory, or its share ``resources.gpu`` of the device when it
shares one; a pack is sized to :data:`HEADROOM` of that (the allocator's fragmentation, the
other tensors of a long run).

* ``pack: auto`` on a GPU: P is also at most what fits (:meth:`PackMemory.fits`), and at most
  :data:`~.limits.MAX_PACK` instead of the CPU's :data:`~.limits.AUTO_MAX`;
* an integer ``resources.pack`` that does not fit is refused before any trial starts, with one
  line that names the memory it needs (:meth:`PackMemory.refusal`).

:func:`measure_on_cluster` runs :func:`measure` as a Ray task holding the study's per-trial
resources, so the GPU measured is one a trial would get.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .probe import on_a_trials_resources

if TYPE_CHECKING:
    from ..spec import StudySpec

__all__ = ["HEADROOM", "PROBE", "PackMemory", "measure", "measure_on_cluster"]

#: share of the trial's memory a pack is sized to
HEADROOM = 0.85
#: the larger pack :func:`measure` runs (the smaller is 1)
PROBE = 4


def _mib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class PackMemory:
    """A pack's device memory, measured, and what a trial may use.

    Args:
        base: Bytes a pack takes whatever its size.
        per_member: Bytes each configuration adds.
        available: Bytes a trial may use on its GPU (free, or its share of the device).
        device: The GPU's name, for the line that refuses a pack.
    """

    base: int
    per_member: int
    available: int
    device: str = "the GPU"

    def need(self, size: int) -> int:
        """Bytes a pack of ``size`` configurations takes."""
        return self.base + size * self.per_member

    def fits(self) -> int:
        """The most configurations a pack may hold within :data:`HEADROOM` of the available
        memory (0: not even one)."""
        room = HEADROOM * self.available - self.base
        return max(0, int(room // max(self.per_member, 1)))

    def refusal(self, size: int) -> str | None:
        """One line saying why a pack of ``size`` cannot run on the trial's GPU, or None."""
        most = self.fits()
        if size <= most:
            return None
        advice = f"pack at most {most}" if most else "not even one configuration fits"
        return (
            f"{size} configurations need {_mib(self.need(size) / HEADROOM)} of GPU memory "
            f"({_mib(self.per_member)} each, {_mib(self.base)} for the task and model, "
            f"{HEADROOM:.0%} usable), but a trial has {_mib(self.available)} on {self.device}: "
            f"{advice}, or use pack: auto"
        )


def measure(spec: StudySpec, gpu: float) -> PackMemory:
    """Measure the study's pack memory on this process's GPU (see the module docstring).

    Args:
        spec: The study (its algorithm packs).
        gpu: ``resources.gpu``: the device's share a trial holds (≥ 1: the whole device).

    Returns:
        The measured memory and what a trial may use.
    """
    import torch

    from fedtune.trainers.packed import PackedTrainer

    base = spec.base_config
    config = dataclasses.replace(base, train=dataclasses.replace(base.train, device="cuda"))
    peaks = []
    for size in (1, PROBE):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        pack = PackedTrainer([config] * size)
        pack.step()
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated() - start)
        del pack
    per_member = max(1, (peaks[1] - peaks[0]) // (PROBE - 1))
    free, total = torch.cuda.mem_get_info()
    available = free if gpu >= 1 else min(free, int(total * gpu))
    name = torch.cuda.get_device_name()
    return PackMemory(max(0, peaks[0] - per_member), per_member, available, name)


def measure_on_cluster(spec: StudySpec) -> PackMemory | None:
    """:func:`measure` as a Ray task holding one trial's ``resources`` (Ray is up).

    Args:
        spec: The study (``resources.gpu`` > 0).

    Returns:
        The measured memory; None when it could not be measured (logged in one line: the
        study then packs as on a CPU, and its trials say what fails).
    """
    gpu = spec.resources.gpu
    return on_a_trials_resources(measure, spec, gpu, gpu=gpu, what="the pack's GPU memory")
