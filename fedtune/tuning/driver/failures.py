"""Honest ends of a study: the first trial error is kept, and a cancelled study leaves no queue.

* :class:`FirstErrorCallback` (a tuner's callback in the driver) stores the first failing
  trial's error, one line, on the Optuna study (user attribute ``fedtune:first_error``, so a
  resumed study keeps it); :func:`first_error` reads it back and :func:`all_failed` says whether
  every finished trial failed — the service then ends the study ``failed`` with that error as
  its reason instead of ``succeeded`` with none.
* :func:`no_best_reason` — the one rule for a study that ends without a best configuration (no
  trial completed with a finite value: every trial diverged, failed or was stopped): the CLI
  exits 1, the service ends the study ``failed``, ``fedtune wait`` exits 1, all with this one
  line as the reason, e.g. ``all 2 trials diverged; trial 0: round 2: client loss nan``.
* :func:`discard_waiting` empties the study's queue: trials ``WAITING`` in Optuna (re-enqueued
  interrupted trials, grid points not run yet) are marked ``FAIL`` with ``outcome: cancelled``.
  The service calls it when a cancelled study's driver stops, so nothing of a cancelled study is
  left to be run; such trials never ran and count towards nothing
  (``optuna.search.study_counts``, ``service.optuna_sync``). With ``orphans=True`` (only once the
  driver is known to be gone: killed before its clean-up ran) trials it left ``RUNNING`` are
  marked ``FAIL`` with ``outcome: interrupted`` too, as its own clean-up would have.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from fedtune.outcomes import TrialOutcome

from ..keys import TRIAL_KEY
from ..optuna.store import StudyStore
from ..trials.view import TrialView
from ..tune_hooks import Callback

__all__ = [
    "FIRST_ERROR_ATTR",
    "FirstErrorCallback",
    "all_failed",
    "discard_waiting",
    "first_error",
    "no_best_reason",
]

FIRST_ERROR_ATTR = "fedtune:first_error"
_MAX_CHARS = 2000


def error_line(trial: TrialView) -> str:
    """One line for a failed Tune trial: the last line of its error trace (:func:`.callback.
    error_line`: the fedtune error's own message, without Ray's ``TrialError:`` wrapper)."""
    from ..mlflow.callback import error_line as last_line

    line = last_line(trial)
    return (line if line != "error" else "the trial failed without an error message")[:_MAX_CHARS]


class FirstErrorCallback(Callback):
    """Keep the first trial error of the study on the Optuna study (see the module docstring)."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    def on_trial_error(self, iteration: int, trials: list, trial: TrialView, **info: Any) -> None:
        if FIRST_ERROR_ATTR in self.study.user_attrs:
            return
        number = trial.config.get(TRIAL_KEY)
        self.study.set_user_attr(FIRST_ERROR_ATTR, {"trial": number, "error": error_line(trial)})


def first_error(study: optuna.Study) -> str | None:
    """``trial N: <error line>`` of the study's first failed trial, if one was recorded."""
    found = study.user_attrs.get(FIRST_ERROR_ATTR)
    if not isinstance(found, Mapping):
        return None
    return f"trial {found.get('trial')}: {found.get('error')}"


def all_failed(counts: Mapping[str, int]) -> bool:
    """Whether trials finished and every one of them failed (``optuna.search.study_counts``)."""
    return counts.get("trials", 0) > 0 and counts.get(TrialOutcome.FAILED, 0) == counts["trials"]


def discard_waiting(store: StudyStore, *, orphans: bool = False) -> int:
    """Mark every ``WAITING`` trial ``FAIL`` with ``outcome: cancelled`` and, with ``orphans``,
    every ``RUNNING`` one ``FAIL`` with ``outcome: interrupted``; returns how many."""
    waiting = store.trials((TrialState.WAITING,))
    for t in waiting:
        store.mark_cancelled(t.number)
    running = store.trials((TrialState.RUNNING,)) if orphans else []
    for t in running:
        store.mark_interrupted(t.number)
    return len(waiting) + len(running)


def no_best_reason(study: optuna.Study, counts: Mapping[str, int]) -> str:
    """One line on why ``study`` has no best configuration (call it only when it has none).

    ``all N trials diverged|failed|were stopped`` when they share one outcome, else ``no trial
    completed (a diverged, b failed, ...)``; then the first trial's own reason: a diverged
    trial's engine reason (``round 2: client loss nan``) or the first error
    (:func:`first_error`), whichever trial came first."""
    ended = (
        TrialOutcome.COMPLETED,
        TrialOutcome.DIVERGED,
        TrialOutcome.FAILED,
        TrialOutcome.STOPPED,
    )
    kinds = {k.value: counts.get(k, 0) for k in ended}
    total = counts.get("trials", 0)
    if total == 0:
        head = "no trial finished"
    elif done := kinds[TrialOutcome.COMPLETED]:
        head = f"no completed trial has a finite value ({done} completed)"
    elif (
        (only := [k for k, n in kinds.items() if n]) and len(only) == 1 and kinds[only[0]] == total
    ):
        verb = "were stopped" if only[0] == TrialOutcome.STOPPED else only[0]
        head = f"all {total} trial{'s' if total != 1 else ''} {verb}"
    else:
        head = "no trial completed (" + ", ".join(f"{n} {k}" for k, n in kinds.items() if n) + ")"
    first = _first_reason(study)
    return f"{head}; {first}" if first else head


def _first_reason(study: optuna.Study) -> str | None:
    error = study.user_attrs.get(FIRST_ERROR_ATTR)
    error_trial = error.get("trial") if isinstance(error, Mapping) else None
    for t in study.get_trials(deepcopy=False):
        if isinstance(error_trial, int) and t.number >= error_trial:
            break
        if t.user_attrs.get("outcome") == TrialOutcome.DIVERGED:
            return f"trial {t.number}: {t.user_attrs.get('reason') or TrialOutcome.DIVERGED}"
    return first_error(study)
