"""fedtune's search strategies run in-process, one trial at a time (the suite's fast path).

Same parts as ``run_study`` — the study's sampler (:func:`~fedtune.tuning.optuna_glue.make_sampler`),
the space's Optuna distributions (``suggest``), the strategy's stopper
(:func:`~fedtune.tuning.strategies.stopper_for`, :mod:`fedtune.tuning.stop_rules`), Optuna's
pruners — and the same meaning of a trial as
:class:`~fedtune.tuning.optuna_glue.FedtuneSearch` gives it (completed → its selection-rule
value, diverged → the worst value, stopped → ``PRUNED`` with its per-round values reported),
but without Ray, MLflow or the RDB storage: a trial is the engine's ``run_trial`` on the task's
built data, and the strategy's stop decision is taken after every round (``report_every: 1``).
A configuration seen before (the same point in the same task) replays its cached curve instead
of training again; a curve cached only up to an earlier stop is trained again from round 1
when more rounds are needed (the engine is deterministic for a configuration).

``asha`` here is Optuna's ``SuccessiveHalvingPruner`` (the study path uses Ray Tune's ASHA:
both asynchronous successive halving, grace ``min_resource``, factor 3, no promotion).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from fedtune.search_spaces.optuna_adapter import suggest
from fedtune.tuning.optuna_glue import make_sampler
from fedtune.tuning.spec import StudySpec
from fedtune.tuning.stop_rules import Stopper

__all__ = ["CurveCache", "Step", "run_strategy"]


@dataclass(frozen=True)
class Step:
    """One finished trial: rounds run, value if completed (inf if diverged), why it stopped."""

    number: int
    point: dict[str, Any]
    rounds: int
    value: float | None  # completed: selection-rule value; diverged: inf; stopped: None
    stop: str | None = None  # the stop reason (stopped trials)
    partial: float | None = None  # selection-rule value at the last round it ran

    def to_row(self) -> list[Any]:
        v = self.value
        return [
            self.rounds,
            None if v is None or not math.isfinite(v) else v,
            "diverged" if v is not None and not math.isfinite(v) else self.stop,
        ]


class CurveCache:
    """ℓ_t per configuration of one task: (losses, outcome, complete?)."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.curves: dict[str, tuple[list[float], str, bool]] = {}
        self.engine_rounds = 0

    @staticmethod
    def key(point: dict[str, Any]) -> str:
        return json.dumps({k: point[k] for k in sorted(point)}, default=str)

    def evaluate(
        self, point: dict[str, Any], go_on: Callable[[int, float], bool]
    ) -> tuple[list[float], str]:
        """Feed ℓ_1, ℓ_2, … to ``go_on(t, ℓ_t)`` until it says stop or the trial ends."""
        key = self.key(point)
        cached = self.curves.get(key)
        if cached is not None:
            losses, outcome, complete = cached
            for t, loss in enumerate(losses, start=1):
                if not go_on(t, loss):
                    return losses[:t], "stopped"
            if complete:
                return losses, outcome
        seen = len(cached[0]) if cached else 0
        losses = []

        def on_round(record: Any) -> bool:
            losses.append(float(record.client_loss))
            t = len(losses)
            return True if t <= seen else go_on(t, losses[-1])

        result = self.task.run(point, on_round)
        self.engine_rounds += result.rounds_completed
        losses = [v for _, v in result.curve("client_loss")]
        outcome = str(result.outcome)
        complete = outcome != "stopped"
        self.curves[key] = (losses, outcome, complete)
        return losses, outcome


def _objective(tail: list[float]) -> float:
    return sum(tail) / len(tail) if tail and all(map(math.isfinite, tail)) else math.inf


def stopper_of(task: Any, spec: StudySpec) -> Stopper:
    """The strategy's stopper, as ``run_study`` builds it (``stopper_for``); ``asha`` and
    ``median`` are Ray Tune schedulers there, Optuna's successive-halving / median pruner here."""
    from fedtune.tuning.stop_rules import PrunerStopper
    from fedtune.tuning.strategies import Strategy, stopper_for

    s = spec.scheduler
    if spec.strategy == Strategy.ASHA:
        pruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=s.grace_rounds, reduction_factor=int(s.reduction_factor)
        )
        return PrunerStopper(pruner, spec.name)
    if spec.strategy == Strategy.MEDIAN:
        pruner = optuna.pruners.MedianPruner(n_warmup_steps=s.grace_rounds)
        return PrunerStopper(pruner, spec.name)
    return stopper_for(spec, task.space, task.rounds)


def run_strategy(
    task: Any,
    strategy: str,
    seed: int,
    round_budget: int,
    max_trials: int,
    target_trials: int,
    cache: CurveCache,
    last: int = 10,
    grace: int | None = None,
) -> list[Step]:
    """Trials of ``strategy`` until ``round_budget`` rounds have run (or ``max_trials``)."""
    from fedtune.tuning.stop_rules import SWEEP_ATTR

    spec: StudySpec = task.spec.model_copy(
        update={
            "name": f"{task.name}-{strategy}-s{seed}",
            "search": task.spec.search.model_copy(update={"strategy": strategy}),
            "sampler": task.spec.sampler.model_copy(update={"seed": seed}),
            "budget": task.spec.budget.model_copy(update={"trials": target_trials}),
            "scheduler": task.spec.scheduler.model_copy(
                update={"grace_rounds": grace or max(1, task.rounds // 6)}
            ),
        }
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(direction="minimize", sampler=make_sampler(spec, target_trials))
        stopper = stopper_of(task, spec)
    tied = {p.path for p in task.space.parameters if p.tied}
    steps: list[Step] = []
    used = 0
    while used < round_budget and len(steps) < max_trials:
        proposal = stopper.propose()
        if proposal is not None:  # as FedtuneSearch._propose: the sweep's point, tagged
            tag, point = proposal
            study.enqueue_trial(
                {k: v for k, v in point.items() if k not in tied}, user_attrs={SWEEP_ATTR: tag}
            )
        trial = study.ask()
        point = suggest(trial, task.space)
        stopper.started(trial.number, trial.user_attrs.get(SWEEP_ATTR))
        tail: list[float] = []
        reason: list[str] = []

        def go_on(t: int, loss: float, trial: Any = trial, tail=tail, reason=reason) -> bool:
            tail.append(loss)
            value = _objective(tail[-last:])
            if math.isfinite(value):
                trial.report(value, t)
            why = stopper.observe(trial.number, [value])
            if why:
                reason.append(str(why))
            return not why

        losses, outcome = cache.evaluate(point, go_on)
        partial = _objective(losses[-last:]) if losses else math.inf
        rounds = len(losses)
        if outcome == "stopped":
            value, state = None, TrialState.PRUNED
        elif outcome == "diverged":
            value, state = math.inf, TrialState.COMPLETE
        else:
            value, state = partial, TrialState.COMPLETE
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study.tell(trial, None if state == TrialState.PRUNED else value, state=state)
        stopper.complete(trial.number, outcome, value if outcome == "completed" else None)
        steps.append(
            Step(trial.number, point, rounds, value, reason[0] if reason else None, partial)
        )
        used += rounds
    return steps
