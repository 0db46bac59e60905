"""A study's run tree in MLflow: its experiment, one parent run per study and one child run per
trial, written with ``MlflowClient`` and explicit run ids only (docs/development/style.md
habit 11) from the *driver*.

The experiment carries the tag ``mlflow.experimentKind = custom_model_development``, so the
MLflow UI shows it as a model-training experiment (its runs table) instead of the GenAI pages.

* one parent run per study (name = study name; params = a summary of the spec; artifacts =
  ``spec.yaml``, ``search_space.yaml``, ``best.json`` and the trade-off under ``tradeoff/``;
  summary metrics at the end; the envelope E(R) as the metric history ``envelope_loss``);
* one child run per Optuna trial (tag ``mlflow.parentRunId``; its params, tags and final
  metrics are the Tune callback's, :mod:`.callback`); per-round metrics with ``step = round``,
  queued by the callback and sent by a background thread that coalesces the rounds of every
  open run into ``log_batch`` calls of at most 1000 entities (:mod:`.round_log`). The learning
  rates ``client_lr``/``server_lr`` and, with decay, ``decays`` are logged at the first and last
  rounds and around each change only (:mod:`.step_points`).

After every invocation (:meth:`StudyTracker.mark_best`) the best child run has the tag
``best_trial = true`` (removed from a previous best), and the parent the tags ``best_trial``
(its number) and ``best_run_id``; the parent gets ``trials_table.json`` (an MLflow table: one
row per trial; past ``TOP_TRIALS`` trials the best ones, the Pareto set and the best trial, the
tag ``trials_table.json`` saying which) and summary metrics logged at ``step = finished trials``.
A resume that changed nothing logs nothing new, an extension only the points that changed
(:meth:`StudyTracker.log_series`): metric histories are never duplicated.

**Nothing queued is lost**: every other tracker call that touches runs first waits until the
rounds queued before it are stored — :meth:`StudyTracker.end_trial` those of its run (a trial's
run is closed only after its last round), :meth:`StudyTracker.reconcile` /
:meth:`StudyTracker.mark_best` / :meth:`StudyTracker.log_series` all of them (the end of a
study, Ctrl-C, a cancel, a resume), and :meth:`StudyTracker.finish_study` also stops the thread.
The queue is bounded: a driver that reports faster than MLflow stores blocks in the callback
(Ray then holds the trainables back) instead of growing a backlog.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.utils.mlflow_tags import MLFLOW_USER

from fedtune.outcomes import TrialOutcome, mlflow_status

from ..common.sqlite_commits import fast_commits_for
from ..keys import ROUND, trial_name
from .client import (
    KIND_TAG,
    KIND_TRAINING,
    PARENT_TAG,
    artifact_text,
    no_run_links,
    now_ms,
    quiet_artifacts,
)
from .record import StudyRecord, study_record
from .round_log import MAX_BATCH, RoundLog
from .sqlite_template import seed_sqlite_store
from .step_points import StepPoints
from .store import prepare_tracking_store
from .tracker import Tracker

if TYPE_CHECKING:
    from ..spec import StudySpec

__all__ = ["BEST_TAG", "StudyTracker", "round_metrics"]

_MAX_PARAMS = 100
_MAX_FLOAT = 1.7976931348623157e308
_MAX_PARAM_LEN = 6000
BEST_TAG = "best_trial"


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


class StudyTracker(Tracker):
    """The study's experiment and run tree in one MLflow tracking store, written from this
    process (:class:`~.tracker.Tracker`).

    Args:
        uri: The tracking URI.
        experiment: The experiment's name (made if missing).
        artifact_root: Where a new experiment keeps its artifacts (None: the store's).
        user: Whom every run it creates names as its user: the tag ``mlflow.user``, which the
            MLflow UI shows as "Created by" (a service's study: its owner). None: no user.
    """

    def __init__(
        self,
        uri: str,
        experiment: str,
        artifact_root: str | None = None,
        user: str | None = None,
    ) -> None:
        self.uri = uri
        self._user_tag = {MLFLOW_USER: user} if user else {}
        seed_sqlite_store(uri)  # a new SQLite store without MLflow's migrations
        fast_commits_for(uri)  # WAL + synchronous=NORMAL (.sqlite_commits)
        prepare_tracking_store(uri)  # a database store's tables, once however many drivers race
        self.client = MlflowClient(tracking_uri=uri)
        self.rounds = RoundLog(self.client)  # per-round metrics, sent by a thread
        self.steps = StepPoints()  # learning rates: only the points that draw their steps
        found = self.client.get_experiment_by_name(experiment)
        if found is not None:
            self.experiment_id = found.experiment_id
            if found.tags.get(KIND_TAG) is None:  # made by an older fedtune: say what it is
                self.client.set_experiment_tag(self.experiment_id, KIND_TAG, KIND_TRAINING)
        else:
            self.experiment_id = self.client.create_experiment(
                experiment, artifact_root, tags={KIND_TAG: KIND_TRAINING}
            )

    # -- parent run ----------------------------------------------------------------
    def start_study(
        self, spec: StudySpec, space_dict: Mapping[str, Any], run_id: str | None
    ) -> str:
        """Reuse ``run_id`` (a resumed study) when it exists here, else create the parent run."""
        return self.start_record(study_record(spec), space_dict, run_id)

    def start_record(
        self, study: StudyRecord, space_dict: Mapping[str, Any], run_id: str | None
    ) -> str:
        """:meth:`start_study` of a study's record (:mod:`.record`)."""
        if run_id is not None:
            try:
                self.client.get_run(run_id)
                self.client.update_run(run_id, status="RUNNING")
                return run_id
            except MlflowException:
                pass  # another tracking store than last time: start a new parent
        tags = {
            "study": study.name,
            "algorithm": study.algorithm,
            "task": study.task,
            **self._user_tag,
        }
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=study.name)
        run_id = run.info.run_id
        document = study.document  # no credential of a URI in the spec reaches MLflow
        params = _flatten({k: v for k, v in document.items() if k != "search"})
        params["search.space"] = study.space
        self._log_params(run_id, params)
        self.client.log_text(run_id, yaml.safe_dump(document, sort_keys=False), "spec.yaml")
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
        step: int = 0,
    ) -> None:
        """Summary metrics (finite ones, at ``step``; a value already there is not logged
        again), an artifact folder, and the parent's final status; every queued round is
        stored first and the round log's thread stops."""
        self.rounds.close()
        ts = now_ms()
        latest = self._latest(run_id)
        items = [
            Metric(k, float(v), ts, step)
            for k, v in metrics.items()
            if math.isfinite(v) and latest.get(k) != (step, float(v))
        ]
        for chunk in _chunks(items, MAX_BATCH):
            self.client.log_batch(run_id, metrics=chunk)
        if artifacts is not None:
            self.client.log_artifacts(run_id, str(artifacts), artifact_path)
        with no_run_links():
            self.client.set_terminated(run_id, status)

    def _latest(self, run_id: str) -> dict[str, tuple[int, float]]:
        run = self.client.get_run(run_id)
        keys = run.data.metrics
        out = {}
        for key in keys:
            history = self.client.get_metric_history(run_id, key)
            if history:
                last = max(history, key=lambda m: (m.step, m.timestamp))
                out[key] = (last.step, last.value)
        return out

    def log_series(self, run_id: str, key: str, points: Iterable[tuple[int, float]]) -> None:
        """``(step, value)`` points of ``key``; a point equal to the latest value already at its
        step is skipped (a resumed or extended study never duplicates a history)."""
        self.rounds.flush()
        ts = now_ms()
        now: dict[int, float] = {}
        for m in sorted(self.client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
            now[m.step] = m.value
        items = [
            Metric(key, float(v), ts, int(s))
            for s, v in points
            if math.isfinite(v) and now.get(int(s)) != float(v)
        ]
        for chunk in _chunks(items, MAX_BATCH):
            self.client.log_batch(run_id, metrics=chunk)

    def mark_best(self, parent: str, best_run: str | None, number: int | None) -> None:
        """Tag the best child run (and only it) and point the parent at it."""
        self.rounds.flush()
        for run in self.child_runs(parent):
            rid = run.info.run_id
            if rid != best_run and run.data.tags.get(BEST_TAG) is not None:
                self.client.delete_tag(rid, BEST_TAG)
        if best_run is None:
            for key in (BEST_TAG, "best_run_id"):
                with contextlib.suppress(MlflowException):
                    self.client.delete_tag(parent, key)
            return
        self.client.set_tag(best_run, BEST_TAG, "true")
        tags = [RunTag(BEST_TAG, str(number)), RunTag("best_run_id", best_run)]
        self.client.log_batch(parent, tags=tags)

    def log_table(
        self, run_id: str, columns: Mapping[str, list], name: str, note: str | None = None
    ) -> None:
        """An MLflow table artifact (the UI shows it as a table); ``note``, what its rows are,
        goes to the run's tag ``name`` (e.g. ``trials_table.json``: "52 of 1000 trials …")."""
        with quiet_artifacts():  # MLflow reads the table back to append to it
            self.client.log_table(run_id, data=dict(columns), artifact_file=name)
        if note is not None:
            self.client.set_tag(run_id, name, note)

    def read_text(self, run_id: str, path: str) -> str:
        """An artifact's text, exactly as stored."""
        return artifact_text(self.client, run_id, path)

    def log_json(self, run_id: str, data: Any, name: str) -> None:
        self.client.log_text(run_id, json.dumps(data, indent=2, default=str), name)

    # -- child runs ----------------------------------------------------------------
    def start_trial(
        self, parent: str, number: int, params: Mapping[str, Any], tags: Mapping[str, str]
    ) -> str:
        all_tags = {
            PARENT_TAG: parent,
            "optuna_trial_number": str(number),
            **tags,
            **self._user_tag,
        }
        run = self.client.create_run(self.experiment_id, tags=all_tags, run_name=trial_name(number))
        self._log_params(run.info.run_id, {k: str(v) for k, v in params.items()})
        return run.info.run_id

    def log_rounds(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Queue the rows' metrics (sent by :attr:`rounds`' thread; see the module docstring)."""
        self.rounds.add(run_id, self.steps.keep(run_id, round_metrics(rows, now_ms())))

    def end_trial(
        self,
        run_id: str,
        status: str,
        tags: Mapping[str, str],
        metrics: Mapping[str, float] | None = None,
        params: Mapping[str, str] | None = None,
        step: int = 0,
    ) -> None:
        """Close a child run: final tags, metrics at ``step`` (±∞ kept: MLflow stores the
        largest float) and params — after the run's queued rounds are stored; the rates'
        last points (:mod:`.step_points`) go with the final metrics."""
        self.rounds.flush(run_id)
        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        ts = now_ms()
        values = [
            Metric(k, float(v), ts, step) for k, v in (metrics or {}).items() if not math.isnan(v)
        ]
        values = [
            m
            if math.isfinite(m.value)
            else Metric(m.key, math.copysign(_MAX_FLOAT, m.value), ts, step)
            for m in values
        ]
        final = {(m.key, m.step) for m in values}  # a final value at that round replaces it
        values += [m for m in self.steps.close(run_id, ts) if (m.key, m.step) not in final]
        if items or values:
            self.client.log_batch(run_id, metrics=values, tags=items)
        if params:
            self._log_params(run_id, params)
        with no_run_links():
            self.client.set_terminated(run_id, status)

    def unsent(self) -> int:
        """How many queued metrics of the rounds are not stored (yet)."""
        return self.rounds.unsent

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
        """Close child runs left RUNNING: a finished trial's run gets its status, others KILLED
        (every queued round is stored first)."""
        self.rounds.flush()
        closed = []
        killed = mlflow_status(TrialOutcome.INTERRUPTED)
        for run in self.child_runs(parent):
            run_id = run.info.run_id
            wanted = statuses.get(run_id, killed)
            if run.info.status == "RUNNING" or (wanted == killed and run.info.status != killed):
                tags = {"outcome": TrialOutcome.INTERRUPTED} if wanted == killed else {}
                self.end_trial(run_id, wanted, tags)
                closed.append(run_id)
        return closed

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        items = [Param(k, str(v)[:_MAX_PARAM_LEN]) for k, v in params.items()]
        for chunk in _chunks(items, _MAX_PARAMS):
            self.client.log_batch(run_id, params=chunk)
