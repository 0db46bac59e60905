"""One study MLflow process that several ``run_study`` calls of a test share.

A study of methods gives each of its studies the same MLflow store process
(``fedtune/cli/study_of_methods.py``: ``tracking_process`` and ``keep_tracking_process``), so
MLflow is imported once, not once a study; tests whose studies only need their records use the
same seam.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def shared_tracking() -> Iterator[dict[str, Any]]:
    """Open one MLflow store process for the studies run inside the block.

    Returns:
        A context manager giving ``run_study``'s keyword arguments that hand each study the
        process and leave it open after the study; the process is closed when the block ends.
    """
    from fedtune.tuning.mlflow.process import TrackerProcess  # MLflow's client, at use only

    with contextlib.closing(TrackerProcess()) as process:
        yield {"tracking_process": process, "keep_tracking_process": True}
