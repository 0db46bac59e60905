"""MLflow behind one adapter (STYLE.md habit 11): ``MlflowClient`` with explicit run ids only.

Run tree of a study (all written from the *driver*; Ray workers never talk to MLflow):

* one parent run per study (name = study name; params = a summary of the spec; artifacts =
  ``spec.yaml``, ``search_space.yaml``, ``best.json`` and the trade-off under ``tradeoff/``;
  summary metrics at the end; the envelope E(R) as the metric history ``envelope_loss``);
* one child run per Optuna trial (tag ``mlflow.parentRunId``; name ``trial-NNNN``; params = the
  trial's hyperparameters; per-round metrics with ``step = round`` sent with ``log_batch`` in
  chunks of at most 1000 entities; tags ``study``, ``algorithm``, ``task``, ``outcome``,
  ``optuna_trial_number``). Final status: ``FINISHED`` for completed, diverged and stopped
  trials (the ``outcome`` tag says which), ``FAILED`` when the trainable raised, ``KILLED``
  when the driver was interrupted (the trial is re-run as a new child run on resume).

Tracking URI: ``--tracking-uri`` > the spec's ``tracking.uri`` > ``MLFLOW_TRACKING_URI`` > a
local SQLite store ``sqlite:///<workdir>/mlflow.db`` whose artifacts go to
``<workdir>/mlartifacts`` (the experiment's artifact location).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunStatus, RunTag
from mlflow.exceptions import MlflowException
from ray.tune import Callback

from .spec import StudySpec
from .trainable import HISTORY, OUTCOME, ROUND, RUNNING, TRIAL_KEY, sampled_params

__all__ = [
    "MAX_BATCH",
    "MlflowCallback",
    "StudyTracker",
    "error_line",
    "resolve_tracking_uri",
    "ui_command",
]

MAX_BATCH = 1000  # MLflow's limit of entities (metrics + params + tags) per log_batch
_MAX_PARAMS = 100
_MAX_PARAM_LEN = 6000
PARENT_TAG = "mlflow.parentRunId"


def resolve_tracking_uri(
    workdir: str | Path,
    explicit: str | None = None,
    spec_uri: str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> str:
    """The tracking URI by precedence (module docstring)."""
    uri = explicit or spec_uri or environ.get("MLFLOW_TRACKING_URI")
    return uri or f"sqlite:///{Path(workdir).resolve() / 'mlflow.db'}"


def ui_command(uri: str) -> str:
    """How to look at the runs: ``mlflow ui`` on a local store, the server's URL otherwise."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri}"


@contextlib.contextmanager
def _no_run_links() -> Iterator[None]:
    """MLflow prints "View run ... at" on stdout when an http run ends: not in our output."""
    key = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
    saved = os.environ.get(key)
    os.environ[key] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def _now() -> int:
    return int(time.time() * 1000)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{path}."))
        else:
            out[path] = str(value)[:_MAX_PARAM_LEN]
    return out


def _chunks(items: list, size: int) -> Iterable[list]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def round_metrics(rows: Iterable[Mapping[str, Any]], timestamp: int) -> list[Metric]:
    """One metric per numeric, finite field of every round row, ``step = round``."""
    out = []
    for row in rows:
        step = int(row[ROUND])
        for key, value in row.items():
            if key == ROUND or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                out.append(Metric(key, float(value), timestamp, step))
    return out


class StudyTracker:
    """The study's experiment and run tree in one MLflow tracking store."""

    def __init__(self, uri: str, experiment: str, artifact_root: str | None = None) -> None:
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            self.experiment_id = found.experiment_id
        else:
            self.experiment_id = self.client.create_experiment(experiment, artifact_root)

    # -- parent run ----------------------------------------------------------------
    def start_study(
        self, spec: StudySpec, space_dict: Mapping[str, Any], run_id: str | None
    ) -> str:
        """Reuse ``run_id`` (a resumed study) when it exists here, else create the parent run."""
        if run_id is not None:
            try:
                self.client.get_run(run_id)
                self.client.update_run(run_id, status="RUNNING")
                return run_id
            except MlflowException:
                pass  # another tracking store than last time: start a new parent
        tags = {"study": spec.name, "algorithm": spec.algorithm, "task": spec.task.get("name", "")}
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=spec.name)
        run_id = run.info.run_id
        params = _flatten({k: v for k, v in spec.to_dict().items() if k != "search"})
        params["search.space"] = str(spec.search.space or "inline")
        self._log_params(run_id, params)
        self.client.log_text(run_id, yaml.safe_dump(spec.to_dict(), sort_keys=False), "spec.yaml")
        self.client.log_text(
            run_id, yaml.safe_dump(dict(space_dict), sort_keys=False), "search_space.yaml"
        )
        return run_id

    def finish_study(
        self,
        run_id: str,
        metrics: Mapping[str, float],
        status: str,
        artifacts: Path | None = None,
        artifact_path: str | None = None,
    ) -> None:
        """Summary metrics (finite ones), an artifact folder, and the parent's final status."""
        ts = _now()
        items = [Metric(k, float(v), ts, 0) for k, v in metrics.items() if math.isfinite(v)]
        for chunk in _chunks(items, MAX_BATCH):
            self.client.log_batch(run_id, metrics=chunk)
        if artifacts is not None:
            self.client.log_artifacts(run_id, str(artifacts), artifact_path)
        with _no_run_links():
            self.client.set_terminated(run_id, status)

    def log_series(self, run_id: str, key: str, points: Iterable[tuple[int, float]]) -> None:
        ts = _now()
        items = [Metric(key, float(v), ts, int(s)) for s, v in points if math.isfinite(v)]
        for chunk in _chunks(items, MAX_BATCH):
            self.client.log_batch(run_id, metrics=chunk)

    def log_json(self, run_id: str, data: Any, name: str) -> None:
        self.client.log_text(run_id, json.dumps(data, indent=2, default=str), name)

    # -- child runs ----------------------------------------------------------------
    def start_trial(
        self, parent: str, number: int, params: Mapping[str, Any], tags: Mapping[str, str]
    ) -> str:
        all_tags = {PARENT_TAG: parent, "optuna_trial_number": str(number), **tags}
        run = self.client.create_run(
            self.experiment_id, tags=all_tags, run_name=f"trial-{number:04d}"
        )
        self._log_params(run.info.run_id, {k: str(v) for k, v in params.items()})
        return run.info.run_id

    def log_rounds(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> None:
        for chunk in _chunks(round_metrics(rows, _now()), MAX_BATCH):
            self.client.log_batch(run_id, metrics=chunk)

    def end_trial(self, run_id: str, status: str, tags: Mapping[str, str]) -> None:
        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        if items:
            self.client.log_batch(run_id, tags=items)
        with _no_run_links():
            self.client.set_terminated(run_id, status)

    def child_runs(self, parent: str) -> list[Any]:
        runs, token = [], None
        while True:
            page = self.client.search_runs(
                [self.experiment_id],
                f"tags.`{PARENT_TAG}` = '{parent}'",
                max_results=1000,
                page_token=token,
            )
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def reconcile(self, parent: str, statuses: Mapping[str, str]) -> list[str]:
        """Close child runs left RUNNING: a finished trial's run gets its status, others KILLED."""
        closed = []
        for run in self.child_runs(parent):
            run_id = run.info.run_id
            wanted = statuses.get(run_id, "KILLED")
            if run.info.status == "RUNNING" or (wanted == "KILLED" and run.info.status != "KILLED"):
                tags = {"outcome": "interrupted"} if wanted == "KILLED" else {}
                self.end_trial(run_id, wanted, tags)
                closed.append(run_id)
        return closed

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        items = [Param(k, str(v)[:_MAX_PARAM_LEN]) for k, v in params.items()]
        for chunk in _chunks(items, _MAX_PARAMS):
            self.client.log_batch(run_id, params=chunk)


def error_line(trial: Any) -> str:
    """The last line of a failed Tune trial's traceback (``ValueError: ...``)."""
    text = ""
    with contextlib.suppress(Exception):  # never fail the driver for a message
        path = trial.error_file  # written on the driver before on_trial_error
        text = Path(path).read_text() if path and Path(path).is_file() else str(trial.get_error())
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "error"


class MlflowCallback(Callback):
    """Tune callback (driver side): one child run per trial, fed by every reported result."""

    def __init__(
        self,
        tracker: StudyTracker,
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
            "task": str(spec.task.get("name", "")),
        }
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
        outcome = result.get(OUTCOME, "failed")
        outcome = "stopped" if outcome == RUNNING else outcome
        self._close(trial, RunStatus.to_string(RunStatus.FINISHED), {"outcome": outcome})

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._close(trial, "FAILED", {"outcome": "failed", "error": error_line(trial)})

    def _close(self, trial: Any, status: str, tags: Mapping[str, str]) -> None:
        run_id = self.runs.pop(trial.trial_id, None)
        if run_id is not None:
            self.tracker.end_trial(run_id, status, tags)
