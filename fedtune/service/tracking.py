"""MLflow side of cancellation: mark a study's unfinished runs ``KILLED``.

The driver marks its runs itself when it is stopped gracefully; this is the service's guarantee
for the other cases (the driver was SIGKILLed, its pod deleted). Runs are the study's parent run
plus every run whose ``mlflow.parentRunId`` tag names it, plus the trial runs the driver recorded.
Trial runs change only while ``RUNNING``/``SCHEDULED`` (a trial that failed before the cancel
stays FAILED); the parent run of a cancelled study ends ``KILLED`` unless it had ``FINISHED``
(a driver stopped by SIGTERM under Ray ends it as FAILED on its way out); MLflow is reached with ``MlflowClient`` and an
explicit tracking URI (no fluent global state; STYLE.md habit 11).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

__all__ = ["kill_runs"]

log = logging.getLogger(__name__)
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_LIVE = ("RUNNING", "SCHEDULED")


def kill_runs(
    tracking_uri: str | None,
    experiment_id: str | None,
    parent_run_id: str | None,
    run_ids: Iterable[str | None] = (),
) -> list[str]:
    """Set the unfinished runs of a study to KILLED; returns the ids changed."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri) if tracking_uri else MlflowClient()
    ids = {r for r in (*run_ids, parent_run_id) if r and _RUN_ID.match(r)}
    if parent_run_id and _RUN_ID.match(parent_run_id) and experiment_id:
        children = client.search_runs(
            [str(experiment_id)], filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'"
        )
        ids.update(run.info.run_id for run in children)
    killed = []
    for run_id in sorted(ids):
        live = (*_LIVE, "FAILED") if run_id == parent_run_id else _LIVE
        try:
            if client.get_run(run_id).info.status in live:
                client.set_terminated(run_id, status="KILLED")
                killed.append(run_id)
        except Exception as exc:  # an unknown/deleted run must not stop the others
            log.warning("cannot mark MLflow run %s KILLED: %s", run_id, exc)
    return killed
