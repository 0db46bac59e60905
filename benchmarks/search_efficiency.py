"""Search efficiency of fedtune's search strategies against the papers' full grid, on two tasks.

* ``quadratic``: a heterogeneous quadratic (20 clients, d = 10, gradient noise), FedAvg with K = 5
  local steps, 60 rounds; searched: γ and η on [10⁻³, 10]; grid: the papers' protocol, γ and η on
  the half-decade grid {10⁻³, 10^−2.5, …, 10¹} (9 × 9 = 81 runs, `000_4bdc3753d62a87e2.txt` App. F).
* ``digits_mlp`` (harder: four parameters, a non-convex model): scikit-learn digits, 50 clients
  split non-IID (Dirichlet 0.3), MLP, FedAvgM (server heavy-ball β), 10 clients per round, batch
  20, **30 rounds** (kept small so the grid is affordable on 2 cores); searched: γ, η on
  [10⁻³, 10] (log), β on [0, 0.99], K on [1, 20] (int, log); grid: γ, η half-decade × β ∈ {0, 0.9}
  × K ∈ {1, 5, 20} = 486 runs, computed once and cached in the JSON (``--reuse-grid``).

Objective = the papers' selection rule, mean ℓ_t over the last 10 rounds (`001_2dc7ddae5cbdc81f.txt`
§8.3). The grid runs on the engine directly; a diverged run stops early, so the grid's *executed*
rounds are below points · R.

Then ``fedtune``'s real study path (``run_study``: Optuna RDB storage + Ray Tune + MLflow) runs each
strategy of ``search.strategy`` — ``tradeoff`` (the default of a new study: theory-guided sweep,
selection-rule stopping, TPE), ``tpe``, ``random`` (no early stopping) and ``tpe_asha`` (TPE + ASHA,
grace 10 rounds / 5 for digits, factor 3) — over the same continuous ranges, one trial at a time,
every trial reporting each round, for each seed (the sampler's seed; the trade-off sweep draws its
phase from it). One run of ``max(budgets)`` trials per method and seed is read at every budget B as
its first B trials — exact with one trial at a time, since no strategy knows the budget (TPE's
startup count is fixed to that of the largest budget). Reported per task, medians over seeds:

* rounds (summed over trials, as executed: stopped and diverged trials count what ran) until the
  best *completed* trial is within 1 % / 5 % of the grid's best value, as a fraction of the grid's
  executed rounds (``null``: not reached within the largest budget), and per seed;
* per budget B: share of seeds that reached 1 % / 5 %, and the relative gap of the best value;
* ``goal``: issue 14 req. 5 — within 1 % using ≤ 10 % of the grid's rounds, median over the seeds,
  reached on every seed.

Overheads: a study whose trials do no work (1 client, d = 1, 1 round): wall time of the tuning
loop / trials (one at a time) minus the engine's own time for such a trial (this includes the
first trial's worker process start), and the steady state: median time between consecutive
trial completions minus the engine time; and the study
start-up time (``run_study`` call → first trial start) with embedded Ray started from nothing,
and with Ray already running. Writes ``benchmarks/results/search_efficiency.json``.

Usage: ``python benchmarks/search_efficiency.py [--tasks quadratic digits_mlp] [--seeds 0 1 2 3 4]
[--budgets 8 16 32 64] [--reuse-grid]``
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

from fedtune.search_spaces import grid_points
from fedtune.trainers import run_trial
from fedtune.tuning.spec import StudySpec

OUT = Path(__file__).resolve().parent / "results" / "search_efficiency.json"
LAST = 10
GOAL = {"tolerance": 0.01, "max_fraction_of_grid_rounds": 0.10}


def quadratic_base(rounds: int) -> dict[str, Any]:
    return {
        "task": {"name": "quadratic", "clients": 20, "dim": 10, "noise": 0.5, "seed": 0},
        "algorithm": "fedavg",
        "train": {"rounds": rounds, "clients_per_round": 5, "local_steps": 5, "batch_size": 4,
                  "eval_every": rounds, "dtype": "float64"},
        "seed": 0,
    }  # fmt: skip


def digits_base(rounds: int) -> dict[str, Any]:
    return {
        "task": {"name": "digits", "clients": 50, "dirichlet": 0.3, "model": "mlp", "seed": 0},
        "algorithm": "fedavgm",
        "train": {"rounds": rounds, "clients_per_round": 10, "batch_size": 20,
                  "eval_every": rounds},
        "seed": 0,
    }  # fmt: skip


DIGITS_SEARCH = {
    "space": "fedavgm",
    "override": {
        "server_momentum": {"grid": [0.0, 0.9]},
        "local_steps": {"enabled": True, "low": 1, "high": 20, "default": 5, "grid": [1, 5, 20]},
    },
}
TASKS = {  # base, search section, default rounds, ASHA grace
    "quadratic": (quadratic_base, {"space": "fedavg"}, 60, 10),
    "digits_mlp": (digits_base, DIGITS_SEARCH, 30, 5),
}
BUDGETS = {"quadratic": [8, 16, 32, 64], "digits_mlp": [16, 32, 64]}  # trials
METHODS = ("tradeoff", "tpe", "random", "tpe_asha")  # search.strategy (tpe_asha = asha)


def task_spec(task: str, rounds: int, name: str = "grid", **extra: Any) -> StudySpec:
    base, search, _, _ = TASKS[task]
    return StudySpec.from_dict({"name": name, **base(rounds), "search": {**search},
                                "objective": {"metric": "train_loss", "last_rounds": LAST},
                                **extra})  # fmt: skip


def run_grid(task: str, rounds: int) -> dict[str, Any]:
    """Every grid point with the engine; best value and executed rounds."""
    spec = task_spec(task, rounds)
    points = grid_points(spec.search_space())
    start, best, executed = time.perf_counter(), (math.inf, None), 0
    for point in points:
        result = run_trial(spec.trial_config(point))
        executed += result.rounds_completed
        value = result.final_loss(LAST)
        if value < best[0]:
            best = (value, point)
    return {"points": len(points), "best_value": best[0], "best_point": best[1],
            "executed_rounds": executed, "nominal_rounds": len(points) * rounds,
            "wall_s": time.perf_counter() - start}  # fmt: skip


def study_spec(task: str, name: str, rounds: int, method: str, seed: int, trials: int) -> StudySpec:
    strategy = "asha" if method == "tpe_asha" else method
    extra: dict[str, Any] = {
        "search": {**TASKS[task][1], "strategy": strategy},
        "sampler": {"seed": seed},
        "budget": {"trials": trials, "max_concurrent": 1},
        # the trade-off rule decides every round; ASHA's rungs (grace 5/10, factor 3) fall on
        # multiples of 5 and TPE/random do not stop trials, so 5 changes none of their rounds
        "report_every": 1 if method == "tradeoff" else 5,
    }
    if method == "tpe_asha":
        extra["scheduler"] = {"grace_rounds": TASKS[task][3], "reduction_factor": 3}
    return task_spec(task, rounds, name, **extra)


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


def goal_status(entry: dict[str, Any], seeds: int) -> dict[str, Any]:
    w = entry["within_1pct"]
    frac = w["median_fraction_of_grid_rounds"]
    met = (
        frac is not None
        and frac <= GOAL["max_fraction_of_grid_rounds"]
        and (w["seeds_reached"] == seeds)
    )
    return {"met": met, "median_fraction_of_grid_rounds": frac,
            "seeds_reached": w["seeds_reached"], "seeds": seeds}  # fmt: skip


def run_task(task: str, args: argparse.Namespace, root: Path, cached: dict | None) -> dict:
    from fedtune.tuning.study import run_study

    rounds = args.rounds or TASKS[task][2]
    budgets = args.budgets or BUDGETS[task]
    settings = {"rounds": rounds, "seeds": args.seeds, "budgets": budgets,
                "last_rounds": LAST, "base": TASKS[task][0](rounds),
                "search": TASKS[task][1], "concurrency": 1,
                "report_every": {"tradeoff": 1, "others": 5},
                "asha": {"grace_rounds": TASKS[task][3], "reduction_factor": 3}}  # fmt: skip
    grid = (cached or {}).get("grid") if args.reuse_grid else None
    if grid is None or (cached or {}).get("settings", {}).get("rounds") != rounds:
        grid = run_grid(task, rounds)
        grid["computed"] = time.strftime("%Y-%m-%d %H:%M:%S")
        grid["load_average_at_start"] = os.getloadavg()
    print(f"{task} grid: best {grid['best_value']:.6g} at {grid['best_point']}, "
          f"{grid['executed_rounds']} rounds executed", file=sys.stderr)  # fmt: skip
    runs: dict[str, list] = {m: [] for m in args.methods}
    walls: dict[str, list] = {m: [] for m in args.methods}
    starts = []
    for method, seed in itertools.product(runs, args.seeds):
        name = f"{task.replace('_', '-')}-{method.replace('_', '-')}-s{seed}"
        spec = study_spec(task, name, rounds, method, seed, max(budgets))
        result = run_study(spec, root / name)
        runs[method].append(trace(result))
        walls[method].append(result.timings["total_s"])
        starts.append(result.timings["startup_s"])
        print(f"{name}: {result.counts} in {result.timings['total_s']:.1f} s", file=sys.stderr)
    search = summarize(runs, grid, budgets)
    measured = {"command": "python benchmarks/search_efficiency.py " + " ".join(sys.argv[1:]),
                "date": time.strftime("%Y-%m-%d %H:%M:%S"), "load_average": os.getloadavg()}  # fmt: skip
    for method, entry in search.items():
        entry["median_study_wall_s"] = statistics.median(walls[method])
        entry["measured"] = measured
    if cached and args.reuse_grid:  # methods not run now keep their measured results
        for method in set(cached.get("search", {})) - set(runs):
            search[method] = cached["search"][method]
            runs[method] = cached["traces"][method]
    return {
        "settings": settings,
        "load_average_at_start": os.getloadavg(),
        "grid": grid,
        "search": search,
        "goal": {m: goal_status(e, len(args.seeds)) for m, e in search.items()},
        "traces": runs,
        "median_startup_with_ray_running_s": statistics.median(starts),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--budgets", type=int, nargs="+", default=None, help=f"default: {BUDGETS}")
    p.add_argument("--rounds", type=int, default=None, help="default: 60 quadratic, 30 digits")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument(
        "--reuse-grid",
        action="store_true",
        help="take each task's grid from the existing JSON (same rounds)",
    )
    p.add_argument("--overhead-trials", type=int, default=20)
    p.add_argument("--skip-overhead", action="store_true", help="keep the JSON's overhead")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)

    import optuna
    import ray

    from fedtune.tuning.study import run_study

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    root = Path(tempfile.mkdtemp(prefix="ftb-", dir="/tmp"))
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    load = os.getloadavg()
    t0 = time.perf_counter()

    overhead, startup = previous.get("overhead"), dict(previous.get("startup") or {})
    if not args.skip_overhead:
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

    # 2) per task: the grid on the engine, then the searches through run_study (Ray started once);
    # the JSON is rewritten after each task
    tasks = dict(previous.get("tasks") or {})
    for entry in tasks.values():  # results of an earlier run keep the command that measured them
        for method in entry.get("search", {}).values():
            method.setdefault("measured", {"command": previous.get("command"),
                                           "load_average": entry.get("load_average_at_start")})  # fmt: skip

    def write() -> None:
        warm = [tasks[t]["median_startup_with_ray_running_s"] for t in args.tasks if t in tasks]
        if warm:
            startup["with_ray_running_median_s"] = statistics.median(warm)
        report = {
            "benchmark": "search_efficiency",
            "environment": environment(),
            "load_average_at_start": load,
            "goal": {"description": "within 1 % of the grid's best using <= 10 % of the grid's "
                     "executed rounds, median over seeds, reached on every seed", **GOAL},
            "tasks": tasks,
            "overhead": overhead,
            "startup": startup,
            "wall_s": time.perf_counter() - t0,
            "command": "python benchmarks/search_efficiency.py " + " ".join(argv or sys.argv[1:]),
        }  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(_finite(report), indent=2, default=str))

    ray.init(num_cpus=len(os.sched_getaffinity(0)), include_dashboard=False,
             _temp_dir=str(root / "ray"), logging_level=logging.ERROR, log_to_driver=False)  # fmt: skip
    try:
        for task in args.tasks:
            tasks[task] = run_task(task, args, root, tasks.get(task))
            write()
    finally:
        ray.shutdown()
    brief = {t: {"grid_best": v["grid"]["best_value"], "goal": v["goal"]} for t, v in tasks.items()}
    print(json.dumps(_finite(brief), indent=2))
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
