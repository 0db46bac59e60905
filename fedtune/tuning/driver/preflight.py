"""Errors only a trial would see, found once on the driver before any trial runs.

A task builder that raises, a model whose outputs do not fit the task's loss, a data file that
cannot be read: each used to surface only inside the trials — Ray started, every trial ran and
failed the same way (measured: 61 s, all trials FAIL, for a builder that always raises). The
driver now builds the study's task and model once, as a trial of its base configuration would
(``fedtune.trainers.Trainer``: the task's builder, the model, the pre-training model check),
on the CPU, in a thread, begun before the stores, MLflow and Ray; its error is the study's, one
line naming the field and the user's ``file:line`` (``fedtune tune``: exit 2; the service: the
study ``failed``), and it stops what is still starting (``study._start_runtime``). The timeline
marks its start and its end (``preflight``, ``preflight_passed`` or ``preflight_failed``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..spec import StudySpec

__all__ = ["preflight"]


def preflight(spec: StudySpec) -> None:
    """Build ``spec``'s task and model once (base configuration, CPU); raise its ``ConfigError``.

    Only what the base configuration builds is checked: a searched value that breaks a task
    (say ``task.heterogeneity`` out of its range) still fails that trial alone."""
    from fedtune.trainers import Trainer

    from ..common import timeline

    timeline.mark("preflight")
    try:
        spec.load_code()
        base = spec.base_config
        Trainer(dataclasses.replace(base, train=dataclasses.replace(base.train, device="cpu")))
    except BaseException:
        timeline.mark("preflight_failed")
        raise
    timeline.mark("preflight_passed")
