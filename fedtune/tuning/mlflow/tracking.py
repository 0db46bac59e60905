"""MLflow behind one adapter (docs/development/style.md habit 11): ``MlflowClient`` with explicit
run ids only.

Run tree of a study (all written from the *driver*; Ray workers never talk to MLflow). The
experiment carries the tag ``mlflow.experimentKind = custom_model_development``, so the MLflow
UI shows it as a model-training experiment (its runs table) instead of the GenAI pages.

* one parent run per study (name = study name; params = a summary of the spec; artifacts =
  ``spec.yaml``, ``search_space.yaml``, ``best.json`` and the trade-off under ``tradeoff/``;
  summary metrics at the end; the envelope E(R) as the metric history ``envelope_loss``);
* one child run per Optuna trial (tag ``mlflow.parentRunId``; name ``trial-NNNN``; params = the
  trial's hyperparameters; per-round metrics with ``step = round``, queued by the Tune callback
  and sent by a background thread that coalesces the rounds of every open run into
  ``log_batch`` calls of at most 1000 entities (:mod:`.round_log`); tags ``study``,
  ``algorithm``, ``task``, ``outcome``, ``optuna_trial_number``, ``objective_metric`` = what the
  metric ``objective`` is, and ``device`` = where the trial computed, ``cpu`` or
  ``cuda:0 (<GPU name>)``). Every
  round logs ``objective`` (the running objective, Optuna's intermediate value); the learning
  rates ``client_lr``/``server_lr`` and, with decay, ``decays`` are logged at the first and
  last rounds and around each change only (:mod:`.analysis.step_points`); at the end the trial's value
  is logged as ``objective`` (∞ for a diverged trial is stored by MLflow as the largest float,
  so it sorts last), with decay the param
  ``decay_rounds``. Final status: ``FINISHED`` for completed, diverged and stopped
  trials (the ``outcome`` tag says which), ``FAILED`` when the trainable raised, ``KILLED``
  when the driver was interrupted (the trial is re-run as a new child run on resume).

After every invocation (:meth:`StudyTracker.mark_best`) the best child run has the tag
``best_trial = true`` (removed from a previous best), and the parent the tags ``best_trial``
(its number) and ``best_run_id``; the parent gets ``trials_table.json`` (an MLflow table: one
row per trial; past ``TOP_TRIALS`` trials the best ones, the Pareto set and the best trial, the
tag ``trials_table.json`` saying which) and summary metrics logged at ``step = finished trials``. A resume that changed
nothing logs nothing new, an extension only the points that changed
(:meth:`StudyTracker.log_series`): metric histories are never duplicated.

**Nothing queued is lost**: every other tracker call that touches runs first waits until the
rounds queued before it are stored — :meth:`StudyTracker.end_trial` those of its run (a trial's
run is closed only after its last round), :meth:`StudyTracker.reconcile` /
:meth:`StudyTracker.mark_best` / :meth:`StudyTracker.log_series` all of them (the end of a
study, Ctrl-C, a cancel, a resume), and :meth:`StudyTracker.finish_study` also stops the thread.
The queue is bounded: a driver that reports faster than MLflow stores blocks in the callback
(Ray then holds the trainables back) instead of growing a backlog.

Tracking URI: ``--tracking-uri`` > the spec's ``tracking.uri`` > ``MLFLOW_TRACKING_URI`` > a
local SQLite store ``sqlite:///<workdir>/mlflow.db`` whose artifacts go to
``<workdir>/mlartifacts`` (the experiment's artifact location). A new SQLite store is a copy of
a cached empty one (:mod:`.sqlite_template`: no migrations at every study's start). The URI's
credentials live only in the driver's memory (:class:`StudyTracker`, the study's plan): nothing
the study writes holds them (``fedtune.tuning.driver.study``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from ray.tune import Callback

from fedtune.outcomes import TrialOutcome, final_outcome, mlflow_status
from fedtune.redact import scrub

from .. import env
from ..driver.sqlite_commits import fast_commits_for
from ..keys import DECAY_ROUNDS, DEVICE, HISTORY, OBJECTIVE, OUTCOME, ROUND, TRIAL_KEY
from ..spec import StudySpec
from ..trials.trainable import sampled_params
from .round_log import MAX_BATCH, RoundLog
from .sqlite_template import seed_sqlite_store
from .step_points import StepPoints
from .store import prepare_tracking_store
from .urls import run_url, ui_url

__all__ = [
    "MAX_BATCH",
    "MlflowCallback",
    "StudyTracker",
    "artifact_text",
    "error_line",
    "kill_study_runs",
    "resolve_tracking_uri",
    "run_experiment_id",
    "run_url",
    "stored_tradeoff",
    "ui_command",
    "ui_url",
]

_MAX_PARAMS = 100
_MAX_FLOAT = 1.7976931348623157e308
_MAX_PARAM_LEN = 6000
PARENT_TAG = "mlflow.parentRunId"
KIND_TAG, KIND_TRAINING = "mlflow.experimentKind", "custom_model_development"
BEST_TAG = "best_trial"
TRADEOFF_FILE = "tradeoff/tradeoff.json"


def resolve_tracking_uri(
    workdir: str | Path,
    explicit: str | None = None,
    spec_uri: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """The tracking URI by precedence (module docstring)."""
    uri = explicit or spec_uri or env.mlflow_tracking_uri(environ)
    return uri or f"sqlite:///{Path(workdir).resolve() / 'mlflow.db'}"


def executable(name: str) -> str:
    """``name`` as a plain shell finds it: the absolute path of the script installed beside
    this Python (a virtual environment need not be active), else the bare name."""
    import shlex
    import sys

    beside = Path(sys.executable).parent / name
    return shlex.quote(str(beside)) if beside.is_file() else name


def ui_command(uri: str) -> str:
    """How to look at the runs: ``mlflow ui`` on a local store (runnable from any shell and
    directory); with a tracking server there is nothing to start (see :func:`ui_url`)."""
    if uri.startswith(("http://", "https://")):
        return ""
    return f"{executable('mlflow')} ui --backend-store-uri {uri}"


def artifact_text(client: MlflowClient, run_id: str, path: str) -> str:
    """The text of a run's artifact, downloaded without MLflow's progress bar on stderr.

    Args:
        client: the tracking client.
        run_id: the run.
        path: the artifact's path in the run.

    Returns:
        Its text, exactly as stored.

    Raises:
        MlflowException: no such run or artifact.
        OSError: the download failed.
    """
    import tempfile

    with tempfile.TemporaryDirectory() as tmp, quiet_artifacts():
        return Path(client.download_artifacts(run_id, path, tmp)).read_text()


def quiet_artifacts() -> contextlib.AbstractContextManager[None]:
    """MLflow draws a progress bar on stderr for every artifact it downloads (also when it reads
    a table back to append to it): not in fedtune's output, nor in a service's log."""
    return mlflow_variable("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


@contextlib.contextmanager
def mlflow_variable(key: str, value: str) -> Iterator[None]:
    """Set one of MLflow's own environment variables while the block runs, then restore it.

    MLflow reads some switches only from the environment (``MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT``,
    ``MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR``); fedtune sets them around the calls that print.

    Args:
        key: The variable.
        value: Its value inside the block.
    """
    saved = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = saved


def _no_run_links() -> contextlib.AbstractContextManager[None]:
    """MLflow prints "View run ... at" on stdout when an http run ends: not in our output."""
    return mlflow_variable("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


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
        if run_id is not None:
            try:
                self.client.get_run(run_id)
                self.client.update_run(run_id, status="RUNNING")
                return run_id
            except MlflowException:
                pass  # another tracking store than last time: start a new parent
        tags = {"study": spec.name, "algorithm": spec.algorithm, "task": spec.task.name}
        run = self.client.create_run(self.experiment_id, tags=tags, run_name=spec.name)
        run_id = run.info.run_id
        document = scrub(spec.to_dict())  # no credential of a URI in the spec reaches MLflow
        params = _flatten({k: v for k, v in document.items() if k != "search"})
        params["search.space"] = str(spec.search.space or "inline")
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
        ts = _now()
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
        with _no_run_links():
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
        ts = _now()
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
        all_tags = {PARENT_TAG: parent, "optuna_trial_number": str(number), **tags}
        run = self.client.create_run(
            self.experiment_id, tags=all_tags, run_name=f"trial-{number:04d}"
        )
        self._log_params(run.info.run_id, {k: str(v) for k, v in params.items()})
        return run.info.run_id

    def log_rounds(self, run_id: str, rows: Iterable[Mapping[str, Any]]) -> None:
        """Queue the rows' metrics (sent by :attr:`rounds`' thread; see the module docstring)."""
        self.rounds.add(run_id, self.steps.keep(run_id, round_metrics(rows, _now())))

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
        last points (:mod:`.analysis.step_points`) go with the final metrics."""
        self.rounds.flush(run_id)
        items = [RunTag(k, str(v)[:5000]) for k, v in tags.items()]
        ts = _now()
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


def stored_tradeoff(uri: str, parent_run_id: str) -> str | None:
    """The text of a study's ``tradeoff/tradeoff.json`` in MLflow (None when not there yet)."""
    client = MlflowClient(tracking_uri=uri)
    try:
        return artifact_text(client, parent_run_id, TRADEOFF_FILE)
    except (MlflowException, OSError):
        return None


_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_LIVE = ("RUNNING", "SCHEDULED")
log = logging.getLogger(__name__)


def kill_study_runs(
    tracking_uri: str | None,
    experiment_id: str | None,
    parent_run_id: str | None,
    run_ids: Iterable[str | None] = (),
) -> list[str]:
    """Set the unfinished runs of a study to KILLED; returns the ids changed."""
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


def run_experiment_id(uri: str, run_id: str) -> str:
    """The experiment of run ``run_id``."""
    return MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id


def error_line(trial: Any) -> str:
    """The last line of a failed Tune trial's traceback (``ValueError: ...``)."""
    text = ""
    with contextlib.suppress(Exception):  # never fail the driver for a message
        path = getattr(trial, "error_file", None)  # written on the driver before on_trial_error
        text = Path(path).read_text() if path and Path(path).is_file() else str(trial.get_error())
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    # Ray names the class that carried a fedtune error out of the trial: the message is the news
    return _TRIAL_ERROR.sub("", lines[-1]) if lines else "error"


_TRIAL_ERROR = re.compile(r"^(?:[\w.]+\.)?TrialError: ")


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
        trial: Any,
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
