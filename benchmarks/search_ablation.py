"""Which parts of the trade-off strategy win: an engine-only ablation (no Ray, no MLflow).

The same tasks, objective, grid best and metric as ``search_efficiency.py`` (rounds summed over
trials until the best completed trial is within 1 % of the grid's best, as a fraction of the
grid's executed rounds; the grid is read from ``benchmarks/results/search_efficiency.json``), but
the study loop is simulated in one process: Optuna TPE ask/tell (pruned trials with their
intermediate values, diverged ones with +inf, as ``FedtuneSearch`` tells them) and the
:mod:`fedtune.tuning.trials.stop_rules` classes (and :mod:`~fedtune.tuning.trials.sweep`) deciding after every round. Variants:

* ``tradeoff`` — the default strategy (sweep + selection-rule stop rule with the trial's own-rate
  projection + plateau rule for sweep steps, then TPE);
* ``raw_rule`` — stops on the raw comparison at equal rounds (no projection: an early rung);
* ``gap_rate`` — projects the gap to the incumbent at the rate it closed (the first design);
* ``no_plateau`` — no plateau rule;
* ``no_stopper`` — sweep, then TPE, nothing stopped;
* ``no_sweep`` — TPE with the stop rule only.

Usage: ``python benchmarks/search_ablation.py [--tasks quadratic digits_mlp] [--seeds 0 1 2 3 4]
[--variants ...]``; writes ``benchmarks/results/search_ablation.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import warnings
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment
from search_efficiency import OUT as EFFICIENCY
from search_efficiency import TASKS, task_spec

from fedtune.search_spaces import suggest
from fedtune.trainers import Trainer
from fedtune.tuning.trials.stop_rules import IncumbentStopper, StopRule, relative_gap
from fedtune.tuning.trials.sweep import TheorySweep

OUT = Path(__file__).resolve().parent / "results" / "search_ablation.json"
LAST = 10
MAX_TRIALS = {"quadratic": 64, "digits_mlp": 64}


class RawRule(StopRule):
    def worse(self, curve, incumbent):
        return self.raw_worse(curve, incumbent)


class GapRateRule(StopRule):
    def worse(self, curve, incumbent):
        t = len(curve)
        if not incumbent or t < self.grace or self.gap(curve, incumbent, t) <= self.margin:
            return False
        now, before = self.gap(curve, incumbent, t), self.gap(curve, incumbent, t - self.window + 1)
        closing = (before - now) / (self.window - 1) if math.isfinite(before) else 0.0
        return now - max(0.0, closing) * (self.rounds - t) > self.margin


class NoPlateau(StopRule):
    def plateaued(self, curve):
        return False


class Never(StopRule):
    def decide(self, curve, incumbent, line):
        return None


RULES = {
    "tradeoff": StopRule,
    "raw_rule": RawRule,
    "gap_rate": GapRateRule,
    "no_plateau": NoPlateau,
    "no_stopper": Never,
    "no_sweep": StopRule,
}


@dataclass
class Run:
    rounds_to_goal: int | None
    trials_to_goal: int | None
    best_gap: float
    rounds: int


def simulate(task: str, variant: str, seed: int, goal: float, grid_best: float) -> Run:
    import optuna

    rounds = TASKS[task][2]
    spec = task_spec(task, rounds)
    space = spec.search_space()
    sweep = TheorySweep(space, seed)
    if variant == "no_sweep":
        sweep.lrs = []
    rule = RULES[variant](**StopRule.for_study(rounds, LAST).__dict__)
    state = IncumbentStopper(sweep, rule)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(
            sampler=optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=10, multivariate=True, group=True, constant_liar=True
            )
        )
    total, best, reached = 0, math.inf, (None, None)
    for n in range(MAX_TRIALS[task]):
        proposal = state.propose()
        if proposal:
            study.enqueue_trial(proposal[1])
        trial = study.ask()
        params = suggest(trial, space)
        state.started(trial.number, proposal[0] if proposal else None)
        trainer = Trainer(spec.trial(params))
        tail: deque[float] = deque(maxlen=LAST)
        outcome = "completed"
        while not trainer.done:
            record = trainer.step()
            if record is None:
                outcome = "diverged"
                break
            tail.append(record.client_loss)
            total += 1
            value = float(np.mean(tail))
            trial.report(value, record.round)
            if state.observe(trial.number, [value]):
                outcome = "stopped"
                break
        value = float(np.mean(tail)) if outcome == "completed" else None
        state.complete(trial.number, outcome, value)
        if outcome == "stopped":
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value if value is not None else math.inf)
        if value is not None and value < best:
            best = value
            if best <= goal and reached[0] is None:
                reached = (total, n + 1)
                break
    return Run(reached[0], reached[1], relative_gap(best, grid_best), total)


def main(argv: list[str] | None = None) -> int:
    import optuna
    import torch

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--variants", nargs="+", choices=list(RULES), default=list(RULES))
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    torch.set_num_threads(1)
    grids = json.loads(EFFICIENCY.read_text())["tasks"]
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results: dict[str, Any] = dict(previous.get("tasks") or {})
    load, t0 = os.getloadavg(), time.perf_counter()
    for task in args.tasks:
        grid = grids[task]["grid"]
        goal = grid["best_value"] * 1.01
        entry = results.setdefault(
            task, {"grid_best": grid["best_value"], "grid_executed_rounds": grid["executed_rounds"]}
        )
        for variant in args.variants:
            runs = [simulate(task, variant, s, goal, grid["best_value"]) for s in args.seeds]
            fracs = [
                r.rounds_to_goal / grid["executed_rounds"] if r.rounds_to_goal else math.inf
                for r in runs
            ]
            median = statistics.median(fracs)
            entry[variant] = {
                "median_fraction_of_grid_rounds": None if math.isinf(median) else median,
                "seeds_reached": sum(r.rounds_to_goal is not None for r in runs),
                "per_seed_rounds": [r.rounds_to_goal for r in runs],
                "per_seed_trials": [r.trials_to_goal for r in runs],
                "per_seed_rounds_run": [r.rounds for r in runs],
            }
            print(task, variant, entry[variant], file=sys.stderr)
    report = {
        "benchmark": "search_ablation",
        "environment": environment(),
        "load_average_at_start": load,
        "seeds": args.seeds,
        "max_trials": MAX_TRIALS,
        "tasks": results,
        "wall_s": time.perf_counter() - t0,
    }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
