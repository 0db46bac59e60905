"""Where a study's trials run — in the driver's process or through Ray — chosen once, from the
typed spec.

:func:`runs_in_process` is the choice. ``run_study`` makes it once, in its prepare phase, from
the validated spec and from where Ray is (a cluster named, a Ray already running in this
process), and keeps it in its plan (``StudyPlan.in_process``); nothing else decides where
trials run. The rule it applies to the spec is :func:`fits_one_process`.

``fedtune tune`` begins what a study will need before it has imported the engine and validated
the spec, which takes seconds: the MLflow store's process for a study whose trials run in the
driver, else the embedded Ray (``ray_session.EarlyRay``). That is a prefetch, not the choice.
:func:`likely_in_process` reads the study file for it, through the same rule and the spec's
defaults, and ``run_study`` puts right what it began for nothing when the spec decides
otherwise: it closes the MLflow process, or stops the early Ray while it is still starting
(:mod:`.ray_thread`), and starts what the choice needs. ``tests/unit/test_placement.py`` holds
the prefetch to the choice on a table of study files.

Light on purpose: ``fedtune tune`` imports this before the engine.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import env

if TYPE_CHECKING:
    from ..spec import StudySpec

__all__ = ["fits_one_process", "likely_in_process", "runs_in_process"]


def runs_in_process(spec: StudySpec, *, allowed: bool, ray_address: str | None = None) -> bool:
    """The choice: whether the study's trials run in this process, without Ray.

    Args:
        spec: The study (validated).
        allowed: The caller lets trials that fit this process run in it (``fedtune tune``
            without ``--ray``).
        ray_address: The Ray cluster the caller named, if any.

    Returns:
        True when allowed, no Ray cluster is named (``ray_address``, ``RAY_ADDRESS``) or runs
        in this process already, and the spec's trials fit one process
        (:func:`fits_one_process`).
    """
    ray = sys.modules.get("ray")  # imported only where Ray may run: this module stays light
    return (
        allowed
        and ray_address is None
        and env.ray_address() is None
        and not (ray is not None and ray.is_initialized())
        and fits_one_process(spec.budget.max_concurrent, spec.resources.gpu, spec.resources.pack)
    )


def likely_in_process(doc: Mapping[str, Any], *, allowed: bool) -> bool:
    """The prefetch's reading of a study file (not validated yet) for :func:`runs_in_process`.

    Args:
        doc: The study file as parsed, the command line's ``--set`` applied.
        allowed: As for :func:`runs_in_process` (a named cluster begins nothing early).

    Returns:
        What :func:`runs_in_process` will decide for the spec that file validates into, in
        this process before any Ray runs; False where the file's values are not yet the
        spec's (the validated spec reports those).
    """
    budget, resources = doc.get("budget") or {}, doc.get("resources") or {}
    if not allowed or not isinstance(budget, Mapping) or not isinstance(resources, Mapping):
        return False
    # the spec's defaults: one configuration at a time, no GPU, pack ``auto`` (which is one
    # process only at max_concurrent 1, as for any pack that is not an integer)
    return fits_one_process(
        budget.get("max_concurrent", 1), resources.get("gpu", 0), resources.get("pack")
    )


def fits_one_process(max_concurrent: Any, gpu: Any, pack: Any = 1) -> bool:
    """Whether a study's trials fit the driver's own process: on the CPU, one configuration at
    a time or all of them in one pack.

    Args:
        max_concurrent: ``budget.max_concurrent`` (configurations at once).
        gpu: ``resources.gpu`` (GPUs per trial process).
        pack: ``resources.pack`` (configurations per process).

    Returns:
        True for ``gpu == 0`` with ``max_concurrent == 1`` or an integer ``pack`` equal to
        ``max_concurrent`` (an integer pack is refused for an algorithm that cannot pack);
        False for anything else, values that are not numbers included.
    """
    if not all(_number(v) for v in (max_concurrent, gpu)) or gpu != 0:
        return False
    return max_concurrent == 1 or (_number(pack) and pack == int(pack) == max_concurrent)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
