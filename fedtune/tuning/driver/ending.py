"""A study's end (the *finalize* phase of :func:`.study.run_study`), and a finished study's
re-run that only reads it.

:func:`finalize` computes the trade-off of every finished trial from the Optuna storage (its
files written, its figures drawn unless drawn from the same inputs already:
:func:`..analysis.report.study_report`), logs it on the parent run with the summary metrics,
the best configuration and the trials' table, and records in the storage the digest of what it
logged (``fedtune:finalized``). :func:`ended` gives a re-run of a finished study its result
from the storage alone when an end now would log exactly that (same trials, spec, tracking
store and parent run, the store's file still there): no MLflow, no figure, no engine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from fedtune.redact import strip_credentials

from ..analysis.report import study_report
from ..common import timeline
from ..optuna import search as og
from ..optuna.trials_table import trials_table
from .failures import first_error, no_best_reason
from .phases import Fitted, Stores, StudyPlan, StudyResult

__all__ = ["ended", "finalize"]


@dataclasses.dataclass(frozen=True)
class _Ending:
    """What a study's end records in MLflow, computed from its storage (no MLflow).

    Args:
        counts: The trials by outcome.
        best: The best configuration (None: none).
        report: The trade-off and its files (:func:`..analysis.report.study_report`).
        finished: The finished trials.
        rounds: The configuration-rounds trained.
        metrics: The parent run's summary metrics.
        table: The trials' table and its note.
        best_run: The best trial's MLflow run (None: none).
    """

    counts: dict[str, int]
    best: dict[str, Any] | None
    report: Any
    finished: int
    rounds: int
    metrics: dict[str, float]
    table: tuple[dict[str, list], str]
    best_run: str | None

    def key(self, uri: str, parent: str, experiment_id: str | None) -> str:
        """The digest of what this end records in the MLflow store ``uri`` on ``parent``.

        Args:
            uri: The tracking URI (its credentials are not part of the digest).
            parent: The parent run.
            experiment_id: Its experiment.

        Returns:
            A hex digest: equal digests, equal records.
        """
        doc = {
            "uri": strip_credentials(uri),
            "parent": parent,
            "experiment": str(experiment_id),
            "metrics": self.metrics,
            "step": self.finished,
            "best": self.best,
            "best_run": self.best_run,
            "pareto": self.report.pareto,
            "envelope": self.report.envelope,
            "table": self.table,
            "files": self.report.inputs,  # the trade-off files: drawn from these inputs
        }
        text = json.dumps(doc, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


def _ending(plan: StudyPlan, stores: Stores) -> _Ending:
    """Compute what the study's end records: counts, best, trade-off (its files written, its
    figures drawn unless drawn from the same inputs already), metrics and the trials' table.

    Args:
        plan: The study's plan.
        stores: The Optuna storage.

    Returns:
        What :func:`finalize` logs.
    """
    spec, space, study = plan.spec, plan.space, stores.study
    counts = og.study_counts(study)
    best = og.best_trial(spec, study, space)
    report = study_report(spec, og.study_curves(stores.store, space), plan.workdir / "tradeoff")
    timeline.mark("report_written")
    finished, rounds = og.count_finished(study), og.rounds_trained(study)
    metrics = {f"n_{k}": float(v) for k, v in counts.items()}
    metrics["configuration_rounds"] = float(rounds)
    if best is not None:
        metrics.update({f"best_{k}": v for k, v in best["values"].items()})
    best_run = stores.store.run_id_of(best["number"]) if best is not None else None
    minimize = str(spec.objective.directions[0]) == "min"
    table = trials_table(
        stores.store, report.analysis, space, minimize, best["number"] if best is not None else None
    )
    return _Ending(counts, best, report, finished, rounds, metrics, table, best_run)


def finalize(plan: StudyPlan, fitted: Fitted) -> StudyResult:
    """Write the trade-off of every finished trial and end the parent run.

    Records the digest of what it logged (:meth:`_Ending.key`) in the study's storage: a re-run
    that would log the same skips MLflow (:func:`ended`).

    Args:
        plan: The study's plan.
        fitted: The stores, the tracking and what the fit measured.

    Returns:
        The study's result.
    """
    start = time.perf_counter()
    timeline.mark("finalize")
    stores, tracker, parent = fitted.stores, fitted.tracking.tracker, fitted.tracking.parent
    end = _ending(plan, stores)
    report = end.report
    if report.envelope:
        tracker.log_series(parent, "envelope_loss", report.envelope)
    tracker.log_json(parent, {"best": end.best, "pareto": report.pareto}, "best.json")
    tracker.mark_best(parent, end.best_run, end.best["number"] if end.best else None)
    table, note = end.table
    if table["number"]:
        tracker.log_table(parent, table, "trials_table.json", note)
    tracker.finish_study(
        parent, end.metrics, "FINISHED", report.directory, "tradeoff", step=end.finished
    )
    stores.store.set_finalized(end.key(tracker.uri, parent, tracker.experiment_id))
    return _result(plan, stores, end, (tracker.uri, tracker.experiment_id, parent), start, fitted)


def ended(plan: StudyPlan, opened: Stores | None) -> StudyResult | None:
    """The result of a finished study whose last end recorded in MLflow exactly what an end
    now would (a re-run of a finished study): nothing is written to MLflow, whose module is
    not imported, and no figure is drawn again.

    Args:
        plan: The study's plan.
        opened: The stored study's storage (None: a new study).

    Returns:
        The study's result; None when the study has trials left, never ended, or would record
        anything else (other trials, another spec or tracking store, a missing store file).
    """
    if opened is None or opened.remaining != 0:
        return None
    recorded = opened.store.finalized()
    parent, experiment_id = opened.store.parent_run()
    if recorded is None or parent is None or experiment_id is None:
        return None
    from ..mlflow.client import resolve_tracking_uri

    uri = resolve_tracking_uri(plan.workdir, plan.tracking_uri, plan.spec.tracking.uri)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        return None  # the MLflow store is gone: the full end makes it again
    start = time.perf_counter()
    end = _ending(plan, opened)
    if end.key(uri, parent, experiment_id) != recorded:
        return None
    return _result(plan, opened, end, (uri, experiment_id, parent), start)


def _result(
    plan: StudyPlan,
    stores: Stores,
    end: _Ending,
    run: tuple[str, str | None, str],
    start: float,
    fitted: Fitted | None = None,
) -> StudyResult:
    """The study's result.

    Args:
        plan: The study's plan.
        stores: The Optuna storage.
        end: What the study's end recorded.
        run: The tracking URI, the experiment and the parent run.
        start: When the end began (``time.perf_counter()``).
        fitted: What the fit measured (None: nothing was fitted).

    Returns:
        The result.
    """
    spec, study, report = plan.spec, stores.study, end.report
    uri, experiment_id, parent = run
    now = time.perf_counter()
    timeline.mark("finalized")
    timings = {
        "startup_s": ((fitted.first_start if fitted else None) or start) - plan.t0,
        "tuning_s": fitted.fit_s if fitted else 0.0,
        "finalize_s": now - start,
        "total_s": now - plan.t0,
    }
    return StudyResult(
        name=spec.name,
        workdir=str(plan.workdir),
        storage_url=og.storage_url(plan.workdir),
        tracking_uri=strip_credentials(uri),
        experiment_id=experiment_id,
        parent_run_id=parent,
        target_trials=plan.target,
        configuration_rounds=end.rounds,
        finished=end.finished,
        ran=end.finished - stores.fixed.finished,
        counts=end.counts,
        best=end.best,
        pareto=report.pareto,
        tradeoff=report.tradeoff,
        artifacts={k: str(v) for k, v in report.files.items()},
        interrupted=list(stores.fixed.interrupted),
        timings=timings,
        stop_reasons=og.stop_reasons(study, spec.scheduler_name and str(spec.scheduler_name)),
        first_error=first_error(study),
        failure=None if end.best is not None else no_best_reason(study, end.counts),
        packing=fitted.packing if fitted else None,
    )
