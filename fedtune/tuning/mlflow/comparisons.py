"""Where a comparison's inputs come from and where it is recorded: local workdirs and MLflow.

* :func:`local_input` reads one local study (a ``fedtune tune`` workdir): its
  ``tradeoff/tradeoff.json`` and ``theory.json``, its parent run (the id the Optuna storage
  keeps) and, from that run, the spec document (``spec.yaml``).
* :func:`record_comparison` makes the comparison an MLflow run of its own (tag
  ``fedtune.kind = comparison``): artifacts ``comparison/comparison.{png,html,json,csv}``;
  metrics per study (``<study>.final_loss_<budget>``, the envelope as the history
  ``<study>.envelope_loss`` with ``step = round``); tags ``compared.<study>`` = each parent
  run id and a note (the run's description in the MLflow UI) linking to them. Each compared
  parent run gets the tags ``comparison.<run id>`` (the comparison's name) and
  ``last_comparison_run_id``, and the metrics ``final_loss_equal_trials`` /
  ``final_loss_equal_rounds`` (so the method runs can be compared side by side in the UI).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fedtune.errors import ConfigError
from fedtune.redact import strip_credentials

from ..analysis.compare import (
    BUDGET_ROUNDS,
    BUDGET_TRIALS,
    BUDGET_WHOLE,
    Comparison,
    RunRef,
    StudyInput,
)

__all__ = ["COMPARISON_DIR", "KIND_TAG", "local_input", "metric_key", "record_comparison"]

KIND_TAG = "fedtune.kind"
COMPARISON_DIR = "comparison"
_BUDGET_KEYS = {BUDGET_TRIALS: "equal_trials", BUDGET_ROUNDS: "equal_rounds", BUDGET_WHOLE: "all"}


def metric_key(study: str, what: str) -> str:
    """An MLflow metric name for ``what`` of ``study`` (characters MLflow refuses become _).

    Args:
        study: The study's key in the comparison.
        what: The metric (``envelope_loss``, ``final_loss_equal_trials``...).

    Returns:
        ``<study>.<what>``.
    """
    return re.sub(r"[^A-Za-z0-9_.\- /]", "_", f"{study}.{what}")


def local_input(workdir: str | Path, tracking_uri: str | None = None) -> StudyInput:
    """One local study, as :func:`fedtune.tuning.analysis.compare.compare` reads it.

    Args:
        workdir: The study's workdir (``fedtune tune --workdir``).
        tracking_uri: Its MLflow store (None: as ``fedtune tune`` chose it, by default
            ``<workdir>/mlflow.db``).

    Returns:
        The study's spec document, trade-off, predictions and parent run.

    Raises:
        ConfigError: No finished study there, or its parent run is not in the store.
    """
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from ..optuna.store import StudyStore, make_storage, storage_url
    from .client import artifact_text, resolve_tracking_uri

    root = Path(workdir)
    tradeoff = root / "tradeoff" / "tradeoff.json"
    if not tradeoff.is_file() or not (root / "optuna.db").is_file():
        raise ConfigError(str(workdir), "no finished study here (no tradeoff/tradeoff.json)")
    import optuna

    names = optuna.study.get_all_study_names(make_storage(storage_url(root)))
    if len(names) != 1:
        raise ConfigError(str(workdir), f"expected one study in optuna.db, found {len(names)}")
    store = StudyStore.existing(root, names[0])
    run_id = store.parent_run_id() if store is not None else None
    uri = resolve_tracking_uri(root, tracking_uri)
    theory = root / "tradeoff" / "theory.json"
    client = MlflowClient(tracking_uri=uri)
    try:
        run = client.get_run(run_id) if run_id else None
        document = yaml.safe_load(artifact_text(client, run_id, "spec.yaml")) if run else None
    except (MlflowException, OSError):
        run, document = None, None
    if run is None or not isinstance(document, dict):
        raise ConfigError(
            str(workdir),
            f"its parent run is not in the MLflow store {uri} (give the store the study used: "
            "--tracking-uri)",
        )
    return StudyInput(
        label=str(workdir),
        document=document,
        tradeoff=json.loads(tradeoff.read_text()),
        theory=json.loads(theory.read_text()) if theory.is_file() else None,
        run=RunRef(strip_credentials(uri), run.info.experiment_id, run.info.run_id),
    )


def _note(c: Comparison, uri: str) -> str:
    lines = [f"Comparison of {', '.join(c.study_keys())}.", ""]
    lines.append(
        "Comparable: same task, data and objective."
        if c.comparable
        else "NOT comparable (forced): " + "; ".join(c.differences)
    )
    lines += ["", "Compared parent runs:"]
    for s in c.studies:
        if s.run_id and s.tracking_uri == uri:
            lines.append(f"* [{s.key}](#/experiments/{s.experiment_id}/runs/{s.run_id})")
        else:
            lines.append(f"* {s.key}: run {s.run_id or '-'} in {s.tracking_uri or '-'}")
    return "\n".join(lines)


def record_comparison(
    c: Comparison,
    directory: str | Path,
    tracking_uri: str,
    experiment: str | None = None,
    name: str | None = None,
    parent_uris: Mapping[str, str] | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """Write the comparison's files and make it an MLflow run (module docstring).

    Args:
        c: The comparison.
        directory: Where its files go (``comparison.png/.html/.json/.csv``).
        tracking_uri: The MLflow store of the comparison run.
        experiment: Its experiment (None: the first compared study's, when it is in this
            store, else ``fedtune-comparisons``).
        name: The run's name (default ``compare-<study>-<study>…``).
        parent_uris: The store of each compared study's parent run, by study key, credentials
            and all (default: the store its :class:`~fedtune.tuning.analysis.compare.StudyLine` names).
        user: Whom the run names as its user (``mlflow.user``, MLflow's "Created by"; None:
            nobody).

    Returns:
        ``run_id``, ``experiment_id``, ``tracking_uri`` and the written ``files``.
    """
    from mlflow import MlflowClient
    from mlflow.entities import Metric, RunTag
    from mlflow.exceptions import MlflowException
    from mlflow.utils.mlflow_tags import MLFLOW_USER

    from ..analysis.compare_render import write_figures
    from .client import KIND_TAG as EXPERIMENT_KIND
    from .client import KIND_TRAINING, no_run_links, now_ms

    files = write_figures(c, directory)
    client = MlflowClient(tracking_uri=tracking_uri)
    first = c.studies[0]
    shown_uri = strip_credentials(tracking_uri)
    if experiment is None and first.tracking_uri == shown_uri and first.experiment_id:
        experiment_id = first.experiment_id
    else:
        wanted = experiment or "fedtune-comparisons"
        found = client.get_experiment_by_name(wanted)
        experiment_id = (
            found.experiment_id
            if found is not None
            else client.create_experiment(wanted, tags={EXPERIMENT_KIND: KIND_TRAINING})
        )
    name = name or "compare-" + "-".join(c.study_keys())
    tags = {
        KIND_TAG: "comparison",
        "comparable": str(c.comparable).lower(),
        "mlflow.note.content": _note(c, strip_credentials(tracking_uri)),
        **{f"compared.{s.key}"[:250]: s.run_id or "-" for s in c.studies},
        **({MLFLOW_USER: user} if user else {}),
    }
    run = client.create_run(experiment_id, tags=tags, run_name=name[:250])
    run_id = run.info.run_id
    ts = now_ms()
    metrics = []
    for r in c.matched:
        if r.final_loss is not None and r.final_loss != float("inf"):
            what = f"final_loss_{_BUDGET_KEYS[r.budget]}"
            metrics.append(Metric(metric_key(r.key, what), float(r.final_loss), ts, 0))
    for key, points in c.envelopes.items():
        for rnd, loss in points:
            if loss != float("inf"):
                metrics.append(Metric(metric_key(key, "envelope_loss"), loss, ts, int(rnd)))
    for i in range(0, len(metrics), 1000):
        client.log_batch(run_id, metrics=metrics[i : i + 1000])
    client.log_param(run_id, "studies", ",".join(c.study_keys())[:6000])
    client.log_artifacts(run_id, str(Path(directory)), COMPARISON_DIR)
    with no_run_links():
        client.set_terminated(run_id, "FINISHED")
    by_key = {s.key: s for s in c.studies}
    for s in by_key.values():
        if not s.run_id or not s.tracking_uri:
            continue
        parent = MlflowClient(tracking_uri=(parent_uris or {}).get(s.key, s.tracking_uri))
        mine = [
            Metric(f"final_loss_{_BUDGET_KEYS[r.budget]}", float(r.final_loss), ts, 0)
            for r in c.matched
            if r.key == s.key and r.budget != BUDGET_WHOLE and r.final_loss is not None
        ]
        with contextlib.suppress(MlflowException):  # a deleted run: the comparison stands
            parent.log_batch(
                s.run_id,
                metrics=[m for m in mine if m.value != float("inf")],
                tags=[
                    RunTag(f"comparison.{run_id}", name[:5000]),
                    RunTag("last_comparison_run_id", run_id),
                    RunTag("last_comparison_uri", strip_credentials(tracking_uri)),
                ],
            )
    return {
        "run_id": run_id,
        "experiment_id": experiment_id,
        "tracking_uri": strip_credentials(tracking_uri),
        "files": {k: str(v) for k, v in files.items()},
    }
