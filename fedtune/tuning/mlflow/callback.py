"""The tuner's callback that turns a study's trials into its MLflow child runs (driver side:
Ray workers never talk to MLflow).

:class:`MlflowCallback` follows Tune's events and writes through the study's
:class:`.tracker.Tracker`:

* a trial's start opens its child run, named ``trial-NNNN``, with params = the trial's
  hyperparameters (and the study's fixed ones, its seed) and tags ``study``, ``algorithm``,
  ``task``, ``optuna_trial_number`` and ``objective_metric`` = what the metric ``objective`` is
  (:func:`objective_description`);
* every reported result queues the rounds not logged yet (``step = round``); every round logs
  ``objective`` (the running objective, Optuna's intermediate value);
* at the end the trial's value is logged as ``objective`` (∞ for a diverged trial is stored by
  MLflow as the largest float, so it sorts last), with decay the param ``decay_rounds`` and the
  metric ``decays``; tags ``outcome`` and ``device`` = where the trial computed, ``cpu`` or
  ``cuda:0 (<GPU name>)``. Final status: ``FINISHED`` for completed, diverged and stopped
  trials (the ``outcome`` tag says which), ``FAILED`` when the trainable raised (tag ``error``,
  the last line of its trace: :func:`error_line`), ``KILLED`` when the driver was interrupted
  (:meth:`.tracking.StudyTracker.reconcile`; the trial is re-run as a new child run on resume).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.outcomes import TrialOutcome, final_outcome, mlflow_status

from ..keys import DECAY_ROUNDS, DEVICE, HISTORY, OBJECTIVE, OUTCOME, ROUND, TRIAL_KEY
from ..spec import StudySpec
from ..trials.results import sampled_params
from ..tune_hooks import Callback

if TYPE_CHECKING:
    from ..trials.view import TrialView
    from .tracker import Tracker

__all__ = ["MlflowCallback", "error_line", "objective_description"]

_TRIAL_ERROR = re.compile(r"^(?:[\w.]+\.)?TrialError: ")


def error_line(trial: TrialView) -> str:
    """The last line of a failed Tune trial's traceback (``ValueError: ...``)."""
    text = ""
    with contextlib.suppress(Exception):  # never fail the driver for a message
        path = getattr(trial, "error_file", None)  # written on the driver before on_trial_error
        text = Path(path).read_text() if path and Path(path).is_file() else str(trial.get_error())
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # Ray names the class that carried a fedtune error out of the trial: the message is the news
    return _TRIAL_ERROR.sub("", lines[-1]) if lines else "error"


class MlflowCallback(Callback):
    """A tuner's callback (driver side): one child run per trial, fed by every reported result."""

    def __init__(
        self,
        tracker: Tracker,
        parent: str,
        spec: StudySpec,
        on_run_created: Callable[[int, str], None] | None = None,
    ) -> None:
        self.tracker, self.parent = tracker, parent
        fixed = {f"hparams.{k}": v for k, v in spec.hparams.items()}
        seeds = spec.trial_seeds()
        self._fixed = {**fixed, "seed": seeds[0] if len(seeds) == 1 else seeds}
        self._tags = {
            "study": spec.name,
            "algorithm": spec.algorithm,
            "task": spec.task.name,
            "objective_metric": objective_description(spec),
        }
        self._finals = [OBJECTIVE, *(str(m) for m in spec.objective.metrics or ())]
        self._on_run_created = on_run_created
        self.runs: dict[str, str] = {}  # Tune trial id -> MLflow run id (open runs)
        self._logged: dict[str, int] = {}

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        number = int(trial.config[TRIAL_KEY])
        params = {**self._fixed, **sampled_params(trial.config)}
        run_id = self.tracker.start_trial(self.parent, number, params, self._tags)
        self.runs[trial.trial_id] = run_id
        if self._on_run_created is not None:
            self._on_run_created(number, run_id)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        run_id = self.runs.get(trial.trial_id)
        if run_id is None:
            return
        last = self._logged.get(trial.trial_id, 0)
        rows = [r for r in result.get(HISTORY, ()) if r[ROUND] > last]
        if rows:
            self.tracker.log_rounds(run_id, rows)
            self._logged[trial.trial_id] = int(rows[-1][ROUND])

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        result = trial.last_result or {}
        self.on_trial_result(iteration, trials, trial, result)
        outcome = final_outcome(result.get(OUTCOME))
        metrics = {k: float(result[k]) for k in self._finals if k in result}
        params = {}
        if DECAY_ROUNDS in result:
            params[DECAY_ROUNDS] = ",".join(map(str, result[DECAY_ROUNDS])) or "none"
            metrics["decays"] = float(len(result[DECAY_ROUNDS]))
        self._close(
            trial,
            mlflow_status(outcome),
            _with_device({"outcome": outcome}, result),
            metrics,
            params,
            int(result.get(ROUND, 0)),
        )

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        failed = TrialOutcome.FAILED
        tags = {"outcome": failed, "error": error_line(trial)}
        self._close(trial, mlflow_status(failed), _with_device(tags, trial.last_result or {}))

    def _close(
        self,
        trial: TrialView,
        status: str,
        tags: Mapping[str, str],
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, str] | None = None,
        step: int = 0,
    ) -> None:
        run_id = self.runs.pop(trial.trial_id, None)
        if run_id is not None:
            self.tracker.end_trial(run_id, status, tags, metrics, params, step)


def _with_device(tags: dict[str, str], result: Mapping[str, Any]) -> dict[str, str]:
    """``tags`` and the ``device`` the trial's last result names (none before its first)."""
    return {**tags, DEVICE: str(result[DEVICE])} if DEVICE in result else tags


def objective_description(spec: StudySpec) -> str:
    """What the metric ``objective`` of a trial run is, in one line."""
    obj = spec.objective
    what = "train_loss" if obj.is_multi else str(obj.single_metric)
    mode = "min" if obj.is_multi else str(obj.directions[0])
    return (
        f"{what} ({mode}): mean {obj.record_field} over the last {obj.last_rounds} rounds "
        "reached; diverged = worst"
    )
