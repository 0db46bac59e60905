"""The names of a round record's extras that readers outside the engine know.

The engine writes them into each :class:`~fedtune.trainers.records.RoundRecord`; the MLflow
tracker logs them as step points (:mod:`fedtune.tuning.mlflow.step_points`). Pure Python and
imported by both, so the tracker's process, which never trains, does not import torch to know
two strings.
"""

from __future__ import annotations

__all__ = ["EVAL_CLIENTS_METRIC", "RUNNER_METRIC"]

#: round-record extra: 1.0 when the round's clients ran vectorized, 0.0 when sequentially
#: (``runner: sequential``, ``auto`` choosing it, or the vectorized runner's fallback)
RUNNER_METRIC = "runner_vectorized"
#: round-record extra of an evaluation round: |E_t|, the clients its population loss covered
EVAL_CLIENTS_METRIC = "eval_clients"
