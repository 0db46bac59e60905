"""A measurement of a study's packs, run where one of its trials would run.

:mod:`.memory` (a GPU pack's memory) and :mod:`.speed` (whether a CPU pack pays) both measure
before the first trial, in a Ray task that holds one trial's ``resources``, so the device
measured is one a trial would get. The task imports the study's ``code`` first, as a trial
does, so that a user's task, model or algorithm is measured like a built-in one. A measurement
that fails is logged in one line and is None: the plan then goes on without it, and the trials
say what fails.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ..spec import StudySpec

log = logging.getLogger(__name__)

__all__ = ["on_a_trials_resources"]

T = TypeVar("T")


def on_a_trials_resources(
    measure: Callable[..., T], spec: StudySpec, *args: Any, gpu: float, what: str
) -> T | None:
    """Run ``measure(spec, *args)`` as a Ray task holding one trial's CPUs and ``gpu`` GPUs.

    Args:
        measure: The measurement (importable by Ray's workers).
        spec: The study.
        *args: More arguments of ``measure``.
        gpu: The GPUs the task holds (0: a CPU measurement).
        what: What it measures, for the line a failure logs.

    Returns:
        Its result; None when it failed (logged in one line).
    """
    import ray

    task: Any = ray.remote(num_cpus=spec.resources.cpu, num_gpus=gpu, max_retries=0)(_with_code)
    try:
        return ray.get(task.remote(measure, spec, *args))
    except Exception as exc:  # no CUDA on the node, user code that fails: say it, go on
        cause = getattr(exc, "cause", None) or exc
        log.warning("%s was not measured: %s", what, str(cause).splitlines()[0])
        return None


def _with_code(measure: Callable[..., T], spec: StudySpec, *args: Any) -> T:
    """``measure(spec, *args)`` after importing the study's ``code`` (a trial's first step)."""
    spec.load_code()
    return measure(spec, *args)
