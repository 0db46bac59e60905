"""The tracking store as the rest of fedtune meets it: which store, how to look at it, and a
study's runs read back or ended — one ``MlflowClient`` call each, no run tree.

Tracking URI (:func:`resolve_tracking_uri`): ``--tracking-uri`` > the spec's ``tracking.uri`` >
``MLFLOW_TRACKING_URI`` > a local SQLite store ``sqlite:///<workdir>/mlflow.db`` whose artifacts
go to ``<workdir>/mlartifacts`` (the experiment's artifact location). A new SQLite store is a
copy of a cached empty one (:mod:`.sqlite_template`: no migrations at every study's start). The
URI's credentials live only in the driver's memory (:class:`.tracking.StudyTracker`, the
study's plan): nothing the study writes holds them (``fedtune.tuning.driver.study``).

MLflow reads some switches only from its environment; :func:`mlflow_variable` sets one around
the calls that would print (a progress bar per downloaded artifact, "View run ... at" when an
http run ends), so neither reaches fedtune's output or a service's log.

A study read back or ended from outside its driver: its trade-off as stored in its parent run
(:func:`stored_tradeoff`), a run's experiment (:func:`run_experiment_id`), and its unfinished
runs set to ``KILLED`` (:func:`kill_study_runs`, the service's cancel).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .. import env

__all__ = [
    "KIND_TAG",
    "KIND_TRAINING",
    "PARENT_TAG",
    "TRADEOFF_FILE",
    "artifact_text",
    "executable",
    "kill_study_runs",
    "mlflow_variable",
    "no_run_links",
    "now_ms",
    "quiet_artifacts",
    "resolve_tracking_uri",
    "run_experiment_id",
    "stored_tradeoff",
    "ui_command",
]

PARENT_TAG = "mlflow.parentRunId"
KIND_TAG, KIND_TRAINING = "mlflow.experimentKind", "custom_model_development"
TRADEOFF_FILE = "tradeoff/tradeoff.json"
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_LIVE = ("RUNNING", "SCHEDULED")
log = logging.getLogger(__name__)


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
    directory); with a tracking server there is nothing to start (see :func:`.urls.ui_url`)."""
    if uri.startswith(("http://", "https://")):
        return ""
    return f"{executable('mlflow')} ui --backend-store-uri {uri}"


def artifact_text(client: Any, run_id: str, path: str) -> str:
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


def no_run_links() -> contextlib.AbstractContextManager[None]:
    """MLflow prints "View run ... at" on stdout when an http run ends: not in our output."""
    return mlflow_variable("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")


def now_ms() -> int:
    """Now, as MLflow stamps a metric: milliseconds since the epoch."""
    return int(time.time() * 1000)


def stored_tradeoff(uri: str, parent_run_id: str) -> str | None:
    """The text of a study's ``tradeoff/tradeoff.json`` in MLflow (None when not there yet)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=uri)
    try:
        return artifact_text(client, parent_run_id, TRADEOFF_FILE)
    except (MlflowException, OSError):
        return None


def kill_study_runs(
    tracking_uri: str | None,
    experiment_id: str | None,
    parent_run_id: str | None,
    run_ids: Iterable[str | None] = (),
) -> list[str]:
    """Set the unfinished runs of a study to KILLED: the service's guarantee when its driver
    could not end them (SIGKILLed, its pod deleted; a driver stopped gracefully ends its own).

    The runs are the parent run, every run whose ``mlflow.parentRunId`` tag names it, and the
    trial runs the driver recorded. A trial run changes only while ``RUNNING``/``SCHEDULED`` (a
    trial that failed before the cancel stays FAILED); the parent run ends ``KILLED`` unless it
    had ``FINISHED`` (a driver stopped by SIGTERM under Ray ends it as FAILED on its way out).
    The parent is ended last, so once it reads ``KILLED`` every other run of the study is ended.

    Args:
        tracking_uri: The study's MLflow store (None: MLflow's default).
        experiment_id: Its experiment (None: its children are not searched).
        parent_run_id: Its parent run, if any.
        run_ids: Its trial runs as the driver recorded them.

    Returns:
        The ids of the runs changed.
    """
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri) if tracking_uri else MlflowClient()
    ids = {r for r in (*run_ids, parent_run_id) if r and _RUN_ID.match(r)}
    if parent_run_id and _RUN_ID.match(parent_run_id) and experiment_id:
        children = client.search_runs(
            [str(experiment_id)], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'"
        )
        ids.update(run.info.run_id for run in children)
    killed = []
    # the parent last, as the driver ends them: a parent seen KILLED has no run left running
    # (a reader that waits for the parent, as the service's clients and tests do, sees all)
    for run_id in sorted(ids, key=lambda r: (r == parent_run_id, r)):
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
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id
