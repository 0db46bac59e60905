"""Search efficiency of TPE+ASHA and random search against the papers' full (γ × η) grid.

Task: a heterogeneous quadratic (20 clients, d = 10, gradient noise), FedAvg with K local steps;
objective = the papers' selection rule, mean ℓ_t over the last 10 rounds
(`001_2dc7ddae5cbdc81f.txt` §8.3). The grid is the papers' protocol: γ and η on the half-decade
grid {10⁻³, 10^−2.5, …, 10¹} (9 × 9 = 81 runs, `000_4bdc3753d62a87e2.txt` App. F), run with the
engine directly; a diverged run stops early, so the grid's *executed* rounds are below 81·R.

Then ``fedtune``'s real study path (``run_study``: Optuna RDB storage + Ray Tune + MLflow) runs
TPE + ASHA, TPE alone and random search (both without early stopping) over the same continuous
log-ranges, one trial at a time, for each seed. One run of ``max(budgets)`` trials per method and seed is read at every
budget B as its first B trials — exact with one trial at a time, since neither sampler knows the
budget (TPE's startup count is fixed to that of the largest budget). Reported, medians over seeds:

* rounds (summed over trials, as executed: ASHA stops and divergence count what ran) until the
  best completed trial is within 1 % / 5 % of the grid's best value, as a fraction of the grid's
  executed rounds (``null``: not reached within the largest budget);
* per budget B: share of seeds that reached 1 % / 5 %, and the relative gap of the best value.

Overheads: a study whose trials do no work (1 client, d = 1, 1 round): wall time of the tuning
loop / trials (one at a time) minus the engine's own time for such a trial (this includes the
first trial's worker process start), and the steady state: median time between consecutive
trial completions minus the engine time; and the study
start-up time (``run_study`` call → first trial start) with embedded Ray started from nothing,
and with Ray already running. Writes ``benchmarks/results/search_efficiency.json``.

Usage: ``python benchmarks/search_efficiency.py [--seeds 0 1 2] [--budgets 8 16 32] [--rounds 60]``
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

from fedtune.search_spaces import grid_points, load_space
from fedtune.trainers import run_trial
from fedtune.tuning.spec import StudySpec

OUT = Path(__file__).resolve().parent / "results" / "search_efficiency.json"
LAST = 10


def base(rounds: int) -> dict[str, Any]:
    return {
        "task": {"name": "quadratic", "clients": 20, "dim": 10, "noise": 0.5, "seed": 0},
        "algorithm": "fedavg",
        "train": {"rounds": rounds, "clients_per_round": 5, "local_steps": 5, "batch_size": 4,
                  "eval_every": rounds, "dtype": "float64"},
        "seed": 0,
    }  # fmt: skip


def run_grid(rounds: int) -> dict[str, Any]:
    """Every half-decade (γ, η) point with the engine; best value and executed rounds."""
    points = grid_points(load_space("fedavg"))
    start, best, executed = time.perf_counter(), (math.inf, None), 0
    for point in points:
        cfg = base(rounds)
        cfg["hparams"] = {k.split(".", 1)[1]: v for k, v in point.items()}
        result = run_trial(cfg)
        executed += result.rounds_completed
        value = result.final_loss(LAST)
        if value < best[0]:
            best = (value, point)
    return {"points": len(points), "best_value": best[0], "best_point": best[1],
            "executed_rounds": executed, "nominal_rounds": len(points) * rounds,
            "wall_s": time.perf_counter() - start}  # fmt: skip


METHODS = ("tpe_asha", "tpe", "random")  # sampler [+ scheduler]; plain names: no early stopping


def study_spec(name: str, rounds: int, method: str, seed: int, trials: int) -> StudySpec:
    tpe, asha = method.startswith("tpe"), method.endswith("_asha")
    return StudySpec.from_dict({
        "name": name, **base(rounds),
        "search": {"space": "fedavg"},
        "objective": {"metric": "train_loss", "last_rounds": LAST},
        "sampler": {"name": "tpe" if tpe else "random", "seed": seed},
        "scheduler": {"name": "asha", "grace_rounds": 10, "reduction_factor": 3}
        if asha else {"name": "none"},
        "budget": {"trials": trials, "max_concurrent": 1},
        "report_every": 5,
    })  # fmt: skip


def trace(result) -> list[tuple[int, float]]:
    """(rounds executed, value if completed else inf) per trial, in completion order."""
    import optuna

    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    done = sorted(
        (t for t in study.trials if t.state.is_finished()), key=lambda t: t.datetime_complete
    )
    out = []
    for t in done:
        ok = t.user_attrs.get("outcome") == "completed"
        out.append((int(t.user_attrs.get("rounds", 0)), t.values[0] if ok else math.inf))
    return out


def rounds_to_within(steps: list[tuple[int, float]], goal: float) -> tuple[int | None, int | None]:
    """Cumulative rounds and trial count when the best completed value first reaches ``goal``."""
    total, best = 0, math.inf
    for i, (rounds, value) in enumerate(steps, start=1):
        total += rounds
        best = min(best, value)
        if best <= goal:
            return total, i
    return None, None


def summarize(runs: dict[str, list], grid: dict[str, Any], budgets: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    g = grid["best_value"]
    for method, steps_per_seed in runs.items():
        entry: dict[str, Any] = {}
        for tol in (0.01, 0.05):
            reached = [rounds_to_within(s, g * (1 + tol)) for s in steps_per_seed]
            fracs = [r / grid["executed_rounds"] if r is not None else math.inf for r, _ in reached]
            median = statistics.median(fracs)
            entry[f"within_{int(tol * 100)}pct"] = {
                "median_fraction_of_grid_rounds": None if math.isinf(median) else median,
                "median_fraction_of_nominal_grid_rounds": None if math.isinf(median)
                else median * grid["executed_rounds"] / grid["nominal_rounds"],
                "per_seed_rounds": [r for r, _ in reached],
                "per_seed_trials": [n for _, n in reached],
                "seeds_reached": sum(r is not None for r, _ in reached),
            }  # fmt: skip
        entry["by_budget"] = {}
        for b in budgets:
            gaps = [min((v for _, v in s[:b]), default=math.inf) / g - 1 for s in steps_per_seed]
            entry["by_budget"][str(b)] = {
                "median_gap": None if math.isinf(statistics.median(gaps)) else statistics.median(gaps),
                "share_within_1pct": sum(x <= 0.01 for x in gaps) / len(gaps),
                "share_within_5pct": sum(x <= 0.05 for x in gaps) / len(gaps),
                "median_rounds_used": statistics.median(sum(r for r, _ in s[:b]) for s in steps_per_seed),
            }  # fmt: skip
        out[method] = entry
    return out


def overhead_spec(name: str, trials: int) -> StudySpec:
    return StudySpec.from_dict({
        "name": name,
        "task": {"name": "quadratic", "clients": 1, "dim": 1, "examples": 1, "seed": 0},
        "algorithm": "fedavg",
        "train": {"rounds": 1, "clients_per_round": 1, "local_steps": 1, "batch_size": 1,
                  "eval_every": 1, "dtype": "float64"},
        "search": {"space": "fedavg"},
        "sampler": {"name": "random", "seed": 0}, "scheduler": {"name": "none"},
        "objective": {"metric": "train_loss", "last_rounds": 1},
        "budget": {"trials": trials, "max_concurrent": 1},
    })  # fmt: skip


def cycle_times(result) -> list[float]:
    """Seconds between consecutive trial completions (one trial at a time): a trial's cycle."""
    import optuna

    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    ends = sorted(t.datetime_complete for t in study.trials if t.datetime_complete)
    return [(b - a).total_seconds() for a, b in itertools.pairwise(ends)]


def engine_time(spec: StudySpec, repeats: int = 20) -> float:
    cfg = spec.trial_config({"hparams.client_lr": 0.1, "hparams.server_lr": 0.1})
    start = time.perf_counter()
    for _ in range(repeats):
        run_trial(cfg)
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--overhead-trials", type=int, default=20)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)

    import optuna
    import ray

    from fedtune.tuning.study import run_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="ftb-", dir="/tmp"))
    load = os.getloadavg()
    t0 = time.perf_counter()

    # 1) start-up from nothing (embedded Ray) + per-trial overhead of do-nothing trials
    spec = overhead_spec("overhead-cold", args.overhead_trials)
    cold = run_study(spec, root / "cold")
    per_trial_engine = engine_time(spec)
    n = cold.counts["trials"]
    cycle = statistics.median(cycle_times(cold))
    overhead = {
        "trials": n,
        "tuning_loop_s": cold.timings["tuning_s"],
        "wall_per_trial_s": cold.timings["tuning_s"] / n,
        "engine_per_trial_s": per_trial_engine,
        "overhead_per_trial_s": cold.timings["tuning_s"] / n - per_trial_engine,
        "steady_state_cycle_s": cycle,
        "steady_state_overhead_per_trial_s": cycle - per_trial_engine,
    }
    startup = {"embedded_ray_from_nothing_s": cold.timings["startup_s"]}

    # 2) the grid, directly on the engine
    grid = run_grid(args.rounds)
    print(f"grid: best {grid['best_value']:.6g} at {grid['best_point']}, "
          f"{grid['executed_rounds']} rounds executed in {grid['wall_s']:.1f} s", file=sys.stderr)  # fmt: skip

    # 3) searches through run_study, Ray started once for all of them
    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
             _temp_dir=str(root / "ray"), logging_level=logging.ERROR, log_to_driver=False)  # fmt: skip
    runs: dict[str, list] = {m: [] for m in args.methods}
    warm = []
    try:
        for method, seed in itertools.product(runs, args.seeds):
            name = f"{method}-s{seed}"
            result = run_study(study_spec(name, args.rounds, method, seed, max(args.budgets)),
                               root / name)  # fmt: skip
            warm.append(result.timings["startup_s"])
            runs[method].append(trace(result))
            print(f"{name}: {result.counts} in {result.timings['total_s']:.1f} s", file=sys.stderr)
    finally:
        ray.shutdown()
    startup["with_ray_running_median_s"] = statistics.median(warm)

    report = {
        "benchmark": "search_efficiency",
        "environment": environment(),
        "load_average_at_start": load,
        "settings": {
            "rounds": args.rounds,
            "seeds": args.seeds,
            "budgets": args.budgets,
            "last_rounds": LAST,
            "task": base(args.rounds)["task"],
            "train": base(args.rounds)["train"],
            "concurrency": 1,
            "asha": {"grace_rounds": 10, "reduction_factor": 3},
        },
        "grid": grid,
        "search": summarize(runs, grid, args.budgets),
        "traces": runs,
        "overhead": overhead,
        "startup": startup,
        "wall_s": time.perf_counter() - t0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(_finite(report), indent=2, default=str))
    print(json.dumps(_finite({k: report[k] for k in ("search", "overhead", "startup")}), indent=2))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


if __name__ == "__main__":
    sys.exit(main())
