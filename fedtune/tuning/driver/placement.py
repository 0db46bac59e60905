"""Where a study's trials run — in the driver's process or through Ray — chosen once, from the
typed spec.

:func:`place` is the choice. ``run_study`` makes it once, in its prepare phase, from the
validated spec and from where Ray is (a cluster named, a Ray already running in this
process), and keeps it in its plan (``StudyPlan.placement``); nothing else decides where
trials run. On this machine, with no cluster named, trials run in the driver's process

* always when they fit it as they are (:func:`fits_one_process`): one configuration at a
  time on the CPU, or all of them in the one pack ``resources.pack`` asks for;
* by cost when the study trains several configurations at once on the CPU with
  ``resources.pack: auto`` and its algorithm packs (:func:`weighed_by_cost`): all of them in
  one pack here when that is estimated to cost no more than Ray Tune's trial processes, Ray's
  start included (:mod:`..packing.cost`, measured on the study's task).

``fedtune tune`` begins what a study will need before it has imported the engine and validated
the spec, which takes seconds: the MLflow store's process for a study whose trials run in the
driver, else the embedded Ray (``ray_session.EarlyRay``). That is a prefetch, not the choice.
:func:`likely_in_process` reads the study file for it, through the same rules and the spec's
defaults (a study weighed by cost counts as one that runs here: the cheaper side is the one to
begin early), and ``run_study`` puts right what it began for nothing when the spec decides
otherwise: it closes the MLflow process, or stops the early Ray while it is still starting
(:mod:`.ray_thread`), and starts what the choice needs. ``tests/unit/test_placement.py`` holds
the prefetch to the choice on a table of study files.

Light on purpose: ``fedtune tune`` imports this before the engine.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import env
from ..packing.limits import AUTO, AUTO_MAX

if TYPE_CHECKING:
    from ..spec import StudySpec

log = logging.getLogger(__name__)

__all__ = [
    "THROUGH_RAY",
    "Placement",
    "fits_one_process",
    "likely_in_process",
    "place",
    "weighed_by_cost",
]


@dataclass(frozen=True)
class Placement:
    """Where a study's trials run, as :func:`place` chose.

    Args:
        in_process: They run in the driver's process, without Ray.
        threads: Torch threads of the trials run there (a trial through Ray gets its
            ``resources.cpu``).
        why: The cost estimate that made the choice, in a few words ("": none was made).
    """

    in_process: bool
    threads: int = 1
    why: str = ""


#: trials through Ray, with nothing weighed
THROUGH_RAY = Placement(False)


def place(
    spec: StudySpec,
    *,
    allowed: bool,
    ray_address: str | None = None,
    target: int | None = None,
) -> Placement:
    """The choice: whether the study's trials run in this process, without Ray.

    Args:
        spec: The study (validated; its code loaded where it has some).
        allowed: The caller lets trials run in its process (``fedtune tune`` without
            ``--ray``).
        ray_address: The Ray cluster the caller named, if any.
        target: The trials the study is to have (None: no limit in trials), for the cost.

    Returns:
        In this process when allowed, no Ray cluster is named (``ray_address``,
        ``RAY_ADDRESS``) or runs in this process already, and the trials fit one process
        (:func:`fits_one_process`) or a pack here is estimated to cost no more than Ray
        (:func:`weighed_by_cost`, :mod:`..packing.cost`); else through Ray.
    """
    # imported only where Ray may run: this module stays light. Another thread (the early Ray,
    # ``fedtune tune``'s prefetch) may be importing it now: import_module waits for the module
    ray = importlib.import_module("ray") if "ray" in sys.modules else None
    local = (
        allowed
        and ray_address is None
        and env.ray_address() is None
        and not (ray is not None and ray.is_initialized())
    )
    res, concurrent = spec.resources, spec.budget.max_concurrent
    if not local:
        return THROUGH_RAY
    if fits_one_process(concurrent, res.gpu, res.pack):
        return Placement(True, max(1, int(res.cpu)))
    if not weighed_by_cost(concurrent, res.gpu, res.pack):
        return THROUGH_RAY
    from ..packing.cost import estimate
    from ..packing.plan import refusal

    try:
        spec.load_code()  # a user's algorithm says whether it packs once registered
        if refusal(spec) is not None:  # one configuration per process: Ray's processes
            return THROUGH_RAY
        cost = estimate(spec, size=concurrent, target=target, cores=os.cpu_count() or 1)
    except Exception as exc:  # the preflight reports a task that fails; Ray as without a cost
        log.info("the cost of a pack in this process was not estimated: %s", exc)
        return THROUGH_RAY
    return Placement(cost.here, cost.threads if cost.here else 1, cost.describe())


def likely_in_process(doc: Mapping[str, Any], *, allowed: bool) -> bool:
    """The prefetch's reading of a study file (not validated yet) for :func:`place`.

    Args:
        doc: The study file as parsed, the command line's ``--set`` applied.
        allowed: As for :func:`place` (a named cluster begins nothing early).

    Returns:
        True where :func:`place` will choose this process, in this process before any Ray
        runs, or may choose it by cost (its estimate needs the engine); False where the file's
        values are not yet the spec's (the validated spec reports those).
    """
    budget, resources = doc.get("budget") or {}, doc.get("resources") or {}
    if not allowed or not isinstance(budget, Mapping) or not isinstance(resources, Mapping):
        return False
    # the spec's defaults: one configuration at a time, no GPU, pack ``auto``
    concurrent, gpu = budget.get("max_concurrent", 1), resources.get("gpu", 0)
    pack = resources.get("pack", AUTO)
    return fits_one_process(concurrent, gpu, pack) or weighed_by_cost(concurrent, gpu, pack)


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


def weighed_by_cost(max_concurrent: Any, gpu: Any, pack: Any) -> bool:
    """Whether a study's trials run in the driver's process or through Ray by their cost: several
    configurations at once on the CPU, packed as ``auto`` decides.

    Args:
        max_concurrent: ``budget.max_concurrent`` (configurations at once).
        gpu: ``resources.gpu`` (GPUs per trial process).
        pack: ``resources.pack`` (configurations per process).

    Returns:
        True for ``gpu == 0``, ``pack == "auto"`` and 2 ≤ ``max_concurrent`` ≤ the most
        configurations ``auto`` packs on a CPU (:data:`~..packing.limits.AUTO_MAX`).
    """
    if pack != AUTO or not all(_number(v) for v in (max_concurrent, gpu)) or gpu != 0:
        return False
    return 2 <= max_concurrent <= AUTO_MAX and max_concurrent == int(max_concurrent)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
