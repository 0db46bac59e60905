"""MLflow side of cancellation: mark a study's unfinished runs ``KILLED``.

The driver marks its runs itself when it is stopped gracefully; this is the service's guarantee
for the other cases (the driver was SIGKILLed, its pod deleted). Runs are the study's parent run
plus every run whose ``mlflow.parentRunId`` tag names it, plus the trial runs the driver recorded.
Trial runs change only while ``RUNNING``/``SCHEDULED`` (a trial that failed before the cancel
stays FAILED); the parent run of a cancelled study ends ``KILLED`` unless it had ``FINISHED``
(a driver stopped by SIGTERM under Ray ends it as FAILED on its way out); MLflow is reached with ``MlflowClient`` and an
explicit tracking URI (no fluent global state; docs/development/style.md habit 11), in the one MLflow adapter
``fedtune.tuning.mlflow`` (its module ``client``).
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["kill_runs"]


def kill_runs(
    tracking_uri: str | None,
    experiment_id: str | None,
    parent_run_id: str | None,
    run_ids: Iterable[str | None] = (),
) -> list[str]:
    """Set the unfinished runs of a study to KILLED; returns the ids changed (through the one
    MLflow adapter, ``fedtune.tuning.mlflow.client.kill_study_runs``)."""
    from fedtune.tuning.mlflow.client import kill_study_runs

    return kill_study_runs(tracking_uri, experiment_id, parent_run_id, run_ids)
