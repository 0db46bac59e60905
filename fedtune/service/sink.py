"""Record a running study's trials for the service (the driver's side of progress).

``run_study(..., sinks=[...])`` (``fedtune/tuning/driver/study.py``) takes extra **callbacks**
(Ray Tune's hooks without Ray: :class:`fedtune.tuning.tune_hooks.Callback`) run in the driver;
each trial's config carries its Optuna trial number under ``fedtune.trial`` and every result the
rounds since the previous report under ``history``. :class:`DbSink` is that callback; it
forwards to :class:`TrialRecorder` (unit tests drive it directly), which writes through the
driver's link (``driver_link``: the API with the study's credential, or the database) and has
the three-method shape::

    on_trial_start(number, params, mlflow_run_id=None)
    on_trial_result(number, rows)              # rows: [{"round": r, metric: value, ...}, ...]
    on_trial_end(number, state, value, outcome)

Writes are keyed by (study, trial number) and (trial, round), so a resumed driver that reports a
trial again updates it instead of duplicating it.

A trial's rounds go out at most every :data:`ROUNDS_EVERY_S` seconds: its first report at once,
later ones gathered into one write per interval (a trial of cheap rounds reports many a second,
each a request to the service that costs it and the driver more than the rows it carries); what
is gathered goes out before the trial's end is written, at the experiment's end and at
:meth:`DbSink.flush` (the driver's, however the study ended).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fedtune.outcomes import TrialOutcome, final_outcome, service_state
from fedtune.tuning.keys import HISTORY, OBJECTIVE, OUTCOME, ROUND, TRIAL_KEY  # the schema
from fedtune.tuning.trials.view import TrialView
from fedtune.tuning.tune_hooks import Callback

from .driver_link import DriverLink
from .states import TrialState

__all__ = ["ROUNDS_EVERY_S", "DbSink", "TrialRecorder"]

log = logging.getLogger(__name__)

#: the shortest time between two writes of a trial's rounds (the module docstring)
ROUNDS_EVERY_S = 0.5


class TrialRecorder:
    """Trial events → the study's trial rows, through the driver's link (one call per event)."""

    def __init__(self, link: DriverLink) -> None:
        self.link = link

    def on_trial_start(
        self, number: int, params: Mapping[str, Any], mlflow_run_id: str | None = None
    ) -> None:
        self.link.trial_started(number, params, mlflow_run_id)

    def on_trial_result(self, number: int, rows: Iterable[Mapping[str, Any]]) -> None:
        self.link.record_rounds(number, rows)

    def on_trial_end(
        self, number: int, state: TrialState, value: float | None, outcome: str | None
    ) -> None:
        self.link.trial_ended(number, state, value, outcome)


class DbSink(Callback):
    """A tuner's callback (driver side) feeding a :class:`TrialRecorder`.

    ``run_id_of(number)`` returns the MLflow run of trial ``number`` when known (the driver reads
    it from the Optuna storage, where ``run_study`` records it before this callback runs).
    """

    def __init__(
        self,
        recorder: TrialRecorder,
        run_id_of: Callable[[int], str | None] | None = None,
        rounds_every_s: float = ROUNDS_EVERY_S,
    ) -> None:
        self.recorder = recorder
        self._run_id_of = run_id_of
        self._seen: dict[str, int] = {}
        self._every = rounds_every_s
        #: per trial number: its rounds not written yet, and when its rounds were last written
        self._pending: dict[int, list[Mapping[str, Any]]] = {}
        self._written: dict[int, float] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Tune pickles its callbacks into the experiment state (for Tuner.restore, which the
        # driver never uses): a copy is inert instead of carrying a database engine.
        return {
            "recorder": None,
            "_run_id_of": None,
            "_seen": {},
            "_every": self._every,
            "_pending": {},
            "_written": {},
        }

    @staticmethod
    def _number(trial: TrialView) -> int:
        return int(trial.config[TRIAL_KEY])

    def _safe(self, what: str, fn: Callable[[], None]) -> None:
        if self.recorder is None:
            return
        try:
            fn()
        except Exception as exc:  # progress writes must never kill the study
            log.warning("recording %s failed: %s", what, exc)

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        number = self._number(trial)
        params = {k: v for k, v in trial.config.items() if k != TRIAL_KEY}
        run_id = None
        if self._run_id_of is not None:
            try:
                run_id = self._run_id_of(number)
            except Exception:
                run_id = None
        self._safe("trial start", lambda: self.recorder.on_trial_start(number, params, run_id))

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        last = self._seen.get(trial.trial_id, 0)
        rows = [r for r in result.get(HISTORY, ()) if int(r[ROUND]) > last]
        if rows:
            self._seen[trial.trial_id] = int(rows[-1][ROUND])
            number = self._number(trial)
            self._pending.setdefault(number, []).extend(rows)
            if time.monotonic() - self._written.get(number, float("-inf")) >= self._every:
                self._write(number)

    def _write(self, number: int) -> None:
        """Write trial ``number``'s gathered rounds, if any."""
        rows = self._pending.pop(number, None)
        if rows:
            self._written[number] = time.monotonic()
            self._safe("rounds", lambda: self.recorder.on_trial_result(number, rows))

    def flush(self) -> None:
        """Write every trial's gathered rounds (the driver calls it however the study ended)."""
        for number in list(self._pending):
            self._write(number)

    def on_experiment_end(self, trials, **info) -> None:
        self.flush()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        result = trial.last_result or {}
        self.on_trial_result(iteration, trials, trial, result)
        self._write(self._number(trial))  # every round before the trial's end
        outcome = final_outcome(result.get(OUTCOME))
        state = service_state(outcome)
        value = result.get(OBJECTIVE)
        number = self._number(trial)
        self._safe("trial end", lambda: self.recorder.on_trial_end(number, state, value, outcome))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        number, failed = self._number(trial), TrialOutcome.FAILED
        self._write(number)
        self._safe(
            "trial error",
            lambda: self.recorder.on_trial_end(number, service_state(failed), None, failed),
        )
