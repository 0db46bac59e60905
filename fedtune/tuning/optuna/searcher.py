"""The study's searcher (Ray Tune's or the in-process tuner's): it asks Optuna's study for each
trial and tells it the outcome.

:class:`FedtuneSearch` works on the study that :func:`~.search.open_study` opened in the Optuna
storage (the source of truth, :mod:`.search`), through Optuna's public ask/tell API only; it
queues the stopper's proposals ahead of the sampler's and charges the round budget.

**What the sampler is told:**

* the running objective (the mean of the last N values of the objective's record field,
  ``fedtune.tuning.trials.results``) → ``trial.report(value, step=round)`` at a *report point*
  (every ``report_every`` rounds), at most once per trial every
  :attr:`FedtuneSearch.REPORT_INTERVAL_S` seconds, and always at the trial's last round
  (single objective; Optuna has no intermediate values for several objectives). One write costs
  the driver ~4 ms of CPU, so a write per round of tens of trials would be the driver's limit;
  and nothing reads the values in between: the study's stopper (``stop_rules``) stops trials,
  the samplers read final values, and a PRUNED trial's value is the *last* intermediate value,
  which is always written. The intermediate values are a live sample of the curve (which rounds
  depends on timing; their values and the trial's value do not); every round is in MLflow and
  in ``fedtune:curve``;
* completed → ``COMPLETE`` with the objective value(s);
* diverged → ``COMPLETE`` with the *worst* values (+∞ minimised / −∞ maximised, every
  objective). We prefer a bad value to ``FAIL``: TPE, GP, NSGA-II and CMA-ES then learn that the
  region is bad (a FAIL is simply ignored and the sampler would keep proposing diverging rates);
  Optuna stores ±∞ exactly and the GP sampler clips it;
* stopped by the study's stopper (ASHA, a stop rule …) or the wall-clock budget → ``PRUNED``;
  Optuna keeps the last intermediate value as the trial's value: the objective at the round it
  reached, the one definition MLflow, the service and the trade-off use too;
* an exception in the trainable → ``FAIL``.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

from fedtune.outcomes import TrialOutcome, final_outcome, optuna_state
from fedtune.search_spaces import SearchSpace, suggest

from ..keys import DECAY_ROUNDS, HISTORY, OBJECTIVE, OUTCOME, ROUND, TRIAL_KEY
from ..spec import Mode, StudySpec
from ..trials.stop_rules import Stopper
from ..trials.sweep import SWEEP_ATTR
from ..tune_hooks import Searcher
from .budget import Ask, RoundBudget
from .store import StudyStore

__all__ = ["FedtuneSearch"]


class FedtuneSearch(Searcher):
    """The searcher on the study's storage, telling Optuna what fedtune's trials mean
    (module docstring); Optuna's public ask/tell API only."""

    REPORT_INTERVAL_S = 1.0  # intermediate values of one trial at most this often (+ the last)

    def __init__(
        self,
        spec: StudySpec,
        space: SearchSpace,
        store: StudyStore,
        sampler: optuna.samplers.BaseSampler,
        stopper: Stopper | None = None,
        budget: RoundBudget | None = None,
    ) -> None:
        multi = spec.objective.is_multi
        modes = [str(m) for m in spec.objective.directions]
        super().__init__(metric=None if multi else OBJECTIVE, mode=None if multi else modes[0])
        self._space_def, self._store, self._multi = space, store, multi
        self._keys = [str(m) for m in spec.objective.metrics] if multi else [OBJECTIVE]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._study = optuna.load_study(
                study_name=spec.name, storage=store.storage, sampler=sampler
            )
        self._worst = [-math.inf if m == Mode.MAX else math.inf for m in spec.objective.directions]
        self._trials: dict[str, optuna.Trial] = {}
        self._done: set[str] = set()
        self._seen: dict[str, int] = {}
        self._curves: dict[str, tuple[list[int], list[float]]] = {}
        self._unreported: dict[str, tuple[float, int]] = {}  # (value, round) not yet written
        self._due_at: dict[str, float] = {}  # when the next write is due
        self._stopper = stopper
        self._budget = budget

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        return not config  # the space is the study's; Tune's param_space stays empty

    def save(self, checkpoint_path: str) -> None:
        """Tune's searcher checkpoint: the state lives in the Optuna storage, write a marker."""
        with open(checkpoint_path, "w") as fh:
            fh.write(f"state in the Optuna storage, study {self._store.name}\n")

    def restore(self, checkpoint_path: str) -> None:
        """Nothing to restore: see :meth:`save`."""

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._budget is not None:
            ask = self._budget.ask()
            if ask != Ask.GO:  # None: ask again when a configuration ends
                return Searcher.FINISHED if ask == Ask.DONE else None
            self._budget.start(trial_id)
        if self._stopper is not None and not self._waiting():
            self._propose()
        trial = self._study.ask()  # an enqueued (re-run, grid or sweep) point first
        self._trials[trial_id] = trial
        if self._stopper is not None:
            self._stopper.started(trial.number, trial.user_attrs.get(SWEEP_ATTR))
        return {**suggest(trial, self._space_def), TRIAL_KEY: trial.number}

    def _waiting(self) -> bool:
        return bool(self._study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    def _propose(self) -> None:
        """Queue the stopper's next proposal (tagged), if it has one."""
        proposal = self._stopper.propose()
        if proposal is None:
            return
        tag, point = proposal
        tied = {p.path for p in self._space_def.parameters if p.tied}
        sampled = {k: v for k, v in point.items() if k not in tied}
        self._study.enqueue_trial(sampled, user_attrs={SWEEP_ATTR: tag})

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        trial = self._trials.get(trial_id)
        if trial is None:
            return
        rounds, losses = self._curves.setdefault(trial_id, ([], []))
        last = self._seen.get(trial_id, 0)
        report: tuple[float, int] | None = None
        for row in result.get(HISTORY, ()):
            if row[ROUND] <= last:
                continue  # a result delivered twice (final result of a function trainable)
            rounds.append(int(row[ROUND]))
            losses.append(float(row["client_loss"]))
            value = row.get(OBJECTIVE)
            if not self._multi and value is not None and math.isfinite(value):
                report = (float(value), int(row[ROUND]))
            last = int(row[ROUND])
        self._seen[trial_id] = last
        if self._budget is not None:
            self._budget.trained(trial_id, last)
        if report is not None:  # the report point's value only, not too often (module docstring)
            self._unreported[trial_id] = report
            if time.monotonic() >= self._due_at.get(trial_id, -math.inf):
                self._report(trial_id, trial)

    def _report(self, trial_id: str, trial: optuna.Trial) -> None:
        """Write the trial's last unwritten report point; the next is due in an interval."""
        pending = self._unreported.pop(trial_id, None)
        if pending is not None:
            trial.report(*pending)
            self._due_at[trial_id] = time.monotonic() + self.REPORT_INTERVAL_S

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False):
        trial = self._trials.get(trial_id)
        if trial is None or trial_id in self._done:
            return
        if result:
            self.on_trial_result(trial_id, result)
        self._report(trial_id, trial)  # the last round's value: a PRUNED trial's value
        self._due_at.pop(trial_id, None)
        outcome = final_outcome((result or {}).get(OUTCOME), error=error)
        state, values = TrialState[optuna_state(outcome)], None  # PRUNED: the last reported value
        if outcome == TrialOutcome.DIVERGED:
            values = list(self._worst)
        elif state == TrialState.COMPLETE:
            values = [float(result[k]) for k in self._keys]
        self._record(trial.number, trial_id, outcome, result or {})
        if self._budget is not None:
            self._budget.end(trial_id, (result or {}).get(ROUND))
        if self._stopper is not None:
            value = values[0] if values and outcome == TrialOutcome.COMPLETED else None
            self._stopper.complete(trial.number, outcome, value)
        self._study.tell(trial, values, state=state)
        self._done.add(trial_id)

    def _record(self, number: int, trial_id: str, outcome: str, result: Mapping) -> None:
        attrs: dict[str, Any] = {"outcome": outcome, "rounds": int(result.get(ROUND, 0))}
        if result.get("reason"):
            attrs["reason"] = str(result["reason"])
        reason = self._stopper.stop_reason(number) if self._stopper is not None else None
        if reason:
            attrs["stop_rule"] = str(reason)
        if DECAY_ROUNDS in result:
            attrs.update(decays=len(result[DECAY_ROUNDS]), decay_rounds=list(result[DECAY_ROUNDS]))
        self._store.set_trial_attrs(number, **attrs)
        rounds, losses = self._curves.get(trial_id, ([], []))
        self._store.set_curve(number, rounds, losses)
