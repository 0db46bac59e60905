"""Search efficiency of fedtune's search strategies against each task's full grid.

The suite: seven small tasks that differ in what makes them hard (``search_tasks.py``: a
quadratic, digits MLP with four parameters, LEAF synthetic(1, 1) whose best has η = 10 γ, digits
with the CNN, FedAvgM with β = 0.9 where η ≪ γ, a quadratic whose best needs LocalUpdateDecay with
W/P/C searched, and the user package ``examples/byo`` through the public extension API). Each
task's grid runs once on the engine and is cached (``results/search_grids/<task>.json``, keyed
by a hash of the task's definition).

Each strategy of ``search.strategy`` — ``tradeoff`` (theory sweep + selection-rule stopping),
``tpe``, ``random``, ``asha`` (TPE + successive halving) and ``hyperband`` (TPE + Optuna's
Hyperband pruner) — runs in-process (``search_sim.py``: the study's sampler, space and stop
rules, the engine per trial, one trial at a time, a decision after every round) for each seed
and each budget B as a study of its own, configured for B trials (the sampler's random start-up
follows B, as in a user's study), until it has run B · T rounds or started 4 · B trials.
**Budgets count rounds actually run**: budget B is B · T rounds (B complete trials' worth), so a
strategy that stops trials early runs more of them within the same budget. Objective = the
papers' selection rule, the mean ℓ_t over the last 10 rounds
(Charles & Konečný 2020 (arXiv:2007.00878) §8.3); a strategy's answer is its best *completed* trial.

Reported per task and strategy (medians over seeds):

* rounds until the best completed trial is within 1 % / 5 % of the grid's best in the largest
  budget's study, as a fraction of the grid's executed rounds (``null``: not reached), seeds
  reached;
* per budget B: median relative gap of the best value to the grid's best, share of seeds within
  1 % / 5 %, trials run / completed / stopped (and why: ``stop_reasons``);
* overall, per strategy: seeds within 1 % and 5 % summed over tasks per budget, the median over
  tasks of the median gap, and on how many (task, budget) pairs its median gap is at most TPE's
  and its seeds within 1 % at least TPE's (the test a new default strategy must pass).

``--pack 1 8`` runs each strategy also as a packed study (``resources.pack: 8``, eight
configurations per trial process, one pack at a time: ``search_sim.run_packed``), reported as
``<strategy>+pack8``, with a budget B still B · T rounds actually run (a packed member counts as
within the budget only when every round its pack had run by the time it ended fits,
``Step.cost``). ``packing`` in the report then says, per strategy and P, on how many (task,
budget) cells the packed study's median gap is at most the unpacked one's and its seeds within
1 % at least as many (issue 30: the default strategy with packing no worse than without it at
equal rounds). A task whose algorithm cannot pack (``byo``: its own round) runs unpacked either
way; ``packing`` lists it apart. ``pack.vmapped_groups`` says what refills cost: a refill starts
at round 0 beside members further on, and a pack runs one vmapped group per distinct round
index (at the largest budget: the median over seeds of the mean groups per round and of the
share of rounds with one group, and the most in any round).

``--concurrent C`` runs the unpacked study with ``budget.max_concurrent = C`` (C trials at once,
a freed slot refilled at once: ``search_sim.run_concurrent``), reported as ``<strategy>@c<C>``
(C = 1: the sequential study, ``<strategy>``). A packed study with ``pack: P`` needs
``max_concurrent >= P``, so the unpacked study it must be compared with runs P configurations at
once too: ``packing`` compares ``<strategy>+pack<P>`` with ``<strategy>@c<P>`` when the report
has it (``--pack 1 P --concurrent P``), and keeps the comparison with the sequential
``<strategy>`` (from this or an earlier run) as ``<strategy>+pack<P> vs <strategy>``.

``--equal-wall SPEED`` compares packed and unpacked studies at equal *wall time* instead of
equal rounds: ``SPEED`` is ``search_pack_speed.py``'s report, the configuration-rounds per
second of each task packed (P configurations in one ``PackedTrainer``) and unpacked (one after
another in one process), and a packed row's budget B becomes B · T · s rounds, s the task's
measured speed-up at its P (the study is configured for B · s trials, so its sampler's start-up
follows that budget as a user's would). The row is ``<strategy>+pack<P>=wall``, its cells
keyed by B: the same wall time as the unpacked rows' B on one core, less the per-trial and
per-report costs of Ray Tune that a pack pays once for P configurations (left out, so the
unpacked side is favoured). A task that cannot pack keeps s = 1.

``--verify TASK SEED STRATEGY TRIALS`` runs that study through ``run_study`` (Ray Tune + Optuna
RDB storage + MLflow) and compares its trials' points, rounds and outcomes with the in-process
path's. Writes ``benchmarks/results/search_efficiency.json``.

Usage: ``python benchmarks/search_efficiency.py [--tasks ...] [--seeds 0 1 2] [--budgets 8 16 32]
[--strategies ...] [--pack 1 8] [--concurrent 8] [--out PATH]``
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import search_tasks as st
from _env import environment
from search_sim import CurveCache, Step, pack_plan, run_strategy, study_spec

from fedtune.wire_base import finite_or_none

OUT = Path(__file__).resolve().parent / "results" / "search_efficiency.json"
LAST = st.LAST
STRATEGIES = ("tpe", "tpe_guard", "hyperband", "tradeoff", "random", "asha")
PACKED = "+pack"  # a packed run's name: <strategy>+pack<P>
CONCURRENT = "@c"  # an unpacked run with C trials at once: <strategy>@c<C>
WALL = "=wall"  # a packed run at the unpacked runs' wall time: <strategy>+pack<P>=wall
TRIAL_CAP = 4  # at most TRIAL_CAP · B trials in a study of budget B (stopping strategies)
#: search_ablation.py's view of the suite: name -> (_, _, rounds, ASHA grace)
TASKS = {
    name: (None, None, st.rounds_of(name), max(1, st.rounds_of(name) // 6)) for name in st.TASKS
}


def task_spec(task: str, rounds: int | None = None, name: str = "grid", **extra: Any):
    """The task as a study (``search_ablation.py`` builds its studies from it)."""
    if rounds is not None:
        train = st.task_spec(task).train
        extra = {"train": {**train, "rounds": rounds}, **extra}
    return st.task_spec(task, name, **extra)


def best_within(steps: list[Step], budget_rounds: int) -> tuple[float, list[Step]]:
    """Best completed value among the trials that finished within ``budget_rounds`` rounds.

    Args:
        steps: A study's trials in the order they ended.
        budget_rounds: Rounds the study may have run (its trials' ``Step.charged``, summed).

    Returns:
        The best value (inf: none completed) and the trials that finished within the budget.
    """
    used, done = 0, []
    for s in steps:
        if used + s.charged > budget_rounds:
            break
        used += s.charged
        done.append(s)
    values = [s.value for s in done if s.value is not None]
    return min(values, default=math.inf), done


def rounds_to_within(steps: list[Step], goal: float) -> tuple[int | None, int | None]:
    """Cumulative rounds and trial count when the best completed value first reaches ``goal``."""
    total, best = 0, math.inf
    for i, s in enumerate(steps, start=1):
        total += s.charged
        if s.value is not None:
            best = min(best, s.value)
        if best <= goal:
            return total, i
    return None, None


def vmapped_groups(studies: list[list[int]]) -> dict[str, Any]:
    """What refills cost a pack: the vmapped groups it ran per round (one per distinct round
    index of its members), over each study's rounds (``search_sim.run_packed``'s ``groups``).

    Args:
        studies: Per study (seed), each round's groups.

    Returns:
        The median over studies of their mean and of their share of rounds with one group, and
        the most groups any round ran.
    """
    ran = [g for g in studies if g]
    if not ran:
        return {"median_mean": None, "median_share_one": None, "max": None}
    return {
        "median_mean": round(statistics.median(statistics.fmean(g) for g in ran), 3),
        "median_share_one": round(statistics.median(g.count(1) / len(g) for g in ran), 3),
        "max": max(max(g) for g in ran),
    }


def summarize(
    by_budget: dict[int, list[list[Step]]], grid: dict[str, Any], scale: float = 1.0
) -> dict:
    """Per budget B, from the seeds' runs of a study configured for B trials (its sampler's
    random start-up follows the study's budget, ``make_sampler``): median gap, seeds within
    1 %/5 %, trials run, stopped and why. Rounds to within 1 %/5 %: the largest budget's runs.
    ``scale`` (``--equal-wall``): a budget B holds B · scale full trials' rounds, and rounds to
    within are counted in unpacked rounds' wall time (configuration-rounds / scale)."""
    g, rounds = grid["best_value"], grid["rounds"]
    budgets = sorted(by_budget)
    runs = by_budget[budgets[-1]]
    entry: dict[str, Any] = {}
    for tol in (0.01, 0.05):
        reached = [rounds_to_within(s, g * (1 + tol)) for s in runs]
        reached = [(None if r is None else round(r / scale), n) for r, n in reached]
        fracs = [r / grid["executed_rounds"] if r is not None else math.inf for r, _ in reached]
        median = statistics.median(fracs)
        entry[f"within_{int(tol * 100)}pct"] = {
            "median_fraction_of_grid_rounds": None if math.isinf(median) else median,
            "per_seed_rounds": [r for r, _ in reached],
            "seeds_reached": sum(r is not None for r, _ in reached),
        }
    entry["by_budget"] = {}
    for b in budgets:
        picked = [best_within(s, round(b * scale * rounds)) for s in by_budget[b]]
        gaps = [v / g - 1 for v, _ in picked]
        reasons: dict[str, int] = {}
        for _, done in picked:
            for s in done:
                if s.value is None:
                    reasons[s.stop or "stopped"] = reasons.get(s.stop or "stopped", 0) + 1
        entry["by_budget"][str(b)] = {
            "median_gap": statistics.median(gaps),
            "gaps": gaps,
            "seeds_within_1pct": sum(x <= 0.01 for x in gaps),
            "seeds_within_5pct": sum(x <= 0.05 for x in gaps),
            "median_trials": statistics.median(len(d) for _, d in picked),
            "median_completed": statistics.median(
                sum(s.value is not None for s in d) for _, d in picked
            ),
            "median_stopped": statistics.median(sum(s.value is None for s in d) for _, d in picked),
            "stop_reasons": reasons,
        }
    return entry


def overall(tasks: dict[str, Any], budgets: list[int]) -> dict[str, Any]:
    """Per strategy over the tasks: seeds within 1 %/5 %, median gap, comparison with TPE."""
    out: dict[str, Any] = {}
    strategies = sorted({m for t in tasks.values() for m in t["search"]})
    for m in strategies:
        row: dict[str, Any] = {"by_budget": {}, "never_worse_than_tpe": True, "worse_than_tpe": []}
        for b in map(str, budgets):
            cells = [t["search"][m]["by_budget"].get(b) for t in tasks.values() if m in t["search"]]
            cells = [c for c in cells if c]
            row["by_budget"][b] = {
                "seeds_within_1pct": sum(c["seeds_within_1pct"] for c in cells),
                "seeds_within_5pct": sum(c["seeds_within_5pct"] for c in cells),
                "median_of_median_gaps": statistics.median(c["median_gap"] for c in cells),
                "tasks": len(cells),
            }
        for name, t in tasks.items():
            tpe, mine = t["search"].get("tpe"), t["search"].get(m)
            if not tpe or not mine:
                continue
            for b in map(str, budgets):
                a, c = mine["by_budget"].get(b), tpe["by_budget"].get(b)
                if not a or not c:
                    continue
                if a["median_gap"] > c["median_gap"] + 1e-12 or (
                    a["seeds_within_1pct"] < c["seeds_within_1pct"]
                ):
                    row["never_worse_than_tpe"] = False
                    row["worse_than_tpe"].append(f"{name}@{b}")
        out[m] = row
    return out


def _gap(value: float | None) -> float:
    """A median gap as compared: None (a report's JSON for no completed trial) is inf."""
    return math.inf if value is None else value


def packing(tasks: dict[str, Any], budgets: list[int]) -> dict[str, Any]:
    """Each packed run against its strategy unpacked, per (task, budget) cell.

    Args:
        tasks: The report's tasks.
        budgets: The budgets B.

    Returns:
        Per packed run (``<strategy>+pack<P>``, against ``<strategy>@c<P>`` when there is one,
        else against the sequential ``<strategy>``; with both, the sequential comparison is
        also there as ``<strategy>+pack<P> vs <strategy>``): the cells where its median gap is at most the
        unpacked one's and its seeds within 1 % at least as many (``no_worse``, of ``cells``),
        each criterion's count, the cells where it is worse, each cell's figures, and the tasks
        that do not pack (their runs are the unpacked study's, counted apart).
    """
    out: dict[str, Any] = {}
    names = sorted({m for t in tasks.values() for m in t["search"] if PACKED in m})
    present = {m for t in tasks.values() for m in t["search"]}
    pairs: list[tuple[str, str, str]] = []  # (key, packed, unpacked)
    for name in names:
        strategy, size = name.split(PACKED)
        wide = f"{strategy}{CONCURRENT}{size}"
        if wide in present:
            pairs.append((name, name, wide))
            if strategy in present:
                pairs.append((f"{name} vs {strategy}", name, strategy))
        else:
            pairs.append((name, name, strategy))
    for key, name, base in pairs:
        row: dict[str, Any] = {
            "packed": name,
            "unpacked": base,
            "cells": 0,
            "no_worse": 0,
            "median_gap_no_worse": 0,
            "seeds_within_1pct_no_worse": 0,
            "worse": [],
            "not_packed": {},
            "by_cell": {},
        }
        for task, t in tasks.items():
            mine, theirs = t["search"].get(name), t["search"].get(base)
            if not mine or not theirs:
                continue
            if not (mine.get("pack") or {}).get("packed", True):
                row["not_packed"][task] = mine["pack"]["note"]
                continue
            for b in map(str, budgets):
                a, c = mine["by_budget"].get(b), theirs["by_budget"].get(b)
                if not a or not c:
                    continue
                gap_ok = _gap(a["median_gap"]) <= _gap(c["median_gap"]) + 1e-12
                seeds_ok = a["seeds_within_1pct"] >= c["seeds_within_1pct"]
                row["cells"] += 1
                row["median_gap_no_worse"] += gap_ok
                row["seeds_within_1pct_no_worse"] += seeds_ok
                row["no_worse"] += gap_ok and seeds_ok
                if not (gap_ok and seeds_ok):
                    row["worse"].append(f"{task}@{b}")
                row["by_cell"][f"{task}@{b}"] = {
                    "median_gap": [c["median_gap"], a["median_gap"]],
                    "seeds_within_1pct": [c["seeds_within_1pct"], a["seeds_within_1pct"]],
                    "median_trials": [c["median_trials"], a["median_trials"]],
                    "no_worse": gap_ok and seeds_ok,
                }
        out[key] = row
    return out


def packing_table(report: dict[str, Any]) -> str:
    """Packed against unpacked per (task, budget): median gap and seeds within 1 % of each.

    Args:
        report: The report (its ``packing``).

    Returns:
        A markdown table per packed run, with its count of cells no worse.
    """
    n = len(report["seeds"])
    rows: list[str] = []
    for key, p in (report.get("packing") or {}).items():
        name, base = p.get("packed", key), p["unpacked"]
        rows += [
            f"| task@B | {base}: gap, 1 % seeds, trials | {name}: gap, 1 % seeds, trials | "
            "no worse |",
            "|---|---|---|---|",
        ]
        for cell, c in p["by_cell"].items():
            gaps = [_gap(g) for g in c["median_gap"]]
            sides = [
                f"{'–' if math.isinf(gaps[i]) else f'{gaps[i]:+.2%}'}, "
                f"{c['seeds_within_1pct'][i]}/{n}, {c['median_trials'][i]:g}"
                for i in (0, 1)
            ]
            rows.append(
                f"| {cell} | {sides[0]} | {sides[1]} | {'yes' if c['no_worse'] else 'no'} |"
            )
        rows.append(
            f"| **{p['no_worse']} / {p['cells']} cells no worse** (gap {p['median_gap_no_worse']}, "
            f"1 % seeds {p['seeds_within_1pct_no_worse']}) | | | |"
        )
        for task, note in p["not_packed"].items():
            rows.append(f"| {task}: not packed ({note}) | | | |")
        rows.append("")
    return "\n".join(rows)


def table(report: dict[str, Any]) -> str:
    """The README's "Search strategies" table: per task and strategy, per budget the median
    gap and seeds within 1 %, trials run (stopped), and rounds to within 1 % of the grid."""
    budgets = [str(b) for b in report["budgets"]]
    n = len(report["seeds"])
    head = [
        "task (grid best)",
        "strategy",
        *(f"B={b}: gap, 1 % seeds, trials (stopped)" for b in budgets),
        "to within 1 %: % of grid rounds (seeds)",
    ]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, t in report["tasks"].items():
        for m, e in t["search"].items():
            cells = [f"{name} ({t['grid']['best_value']:.4g})", m]
            for b in budgets:
                c = e["by_budget"][b]
                gap = c["median_gap"]
                gap_s = "–" if gap is None else f"{gap:+.1%}"
                cells.append(
                    f"{gap_s}, {c['seeds_within_1pct']}/{n}, "
                    f"{c['median_trials']:g} ({c['median_stopped']:g})"
                )
            w = e["within_1pct"]
            frac = w["median_fraction_of_grid_rounds"]
            cells.append(f"{'–' if frac is None else f'{frac:.1%}'} ({w['seeds_reached']}/{n})")
            rows.append("| " + " | ".join(cells) + " |")
    rows += [
        "",
        "| overall | tasks | "
        + " | ".join(f"B={b}: 1 % seeds, 5 % seeds, median gap" for b in budgets)
        + " | never worse than TPE |",
        "|" + "---|" * (len(budgets) + 3),
    ]
    for m, o in report["overall"].items():
        cells = [m, str(o["by_budget"][budgets[0]]["tasks"])]
        for b in budgets:
            c = o["by_budget"][b]
            g = c["median_of_median_gaps"]
            cells.append(
                f"{c['seeds_within_1pct']}, {c['seeds_within_5pct']}, "
                f"{'–' if g is None else f'{g:+.1%}'}"
            )
        worse = ", ".join(o["worse_than_tpe"])
        cells.append("yes" if o["never_worse_than_tpe"] else f"no ({worse})")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def run_task(task: str, args: argparse.Namespace, previous: dict | None) -> dict[str, Any]:
    grid = st.grid_of(task, log=lambda s: print(s, file=sys.stderr))
    grid = {k: v for k, v in grid.items() if k not in ("values", "grid", "definition")}
    t = st.Task(task)
    cache = CurveCache(t)
    budgets = args.budgets
    search: dict[str, Any] = dict((previous or {}).get("search") or {})
    traces: dict[str, Any] = dict((previous or {}).get("traces") or {})
    for m, pack in [(m, p) for m in args.strategies for p in args.pack]:
        wide = args.concurrent if pack == 1 else 1  # packed: one pack at a time
        name = f"{m}{PACKED}{pack}" if pack > 1 else m if wide == 1 else f"{m}{CONCURRENT}{wide}"
        wall = args.equal_wall is not None and pack > 1  # at the unpacked rows' wall time
        scale = wall_scale(args.equal_wall, task, pack) if wall else 1.0
        name += WALL if wall else ""
        start = time.perf_counter()
        runs: dict[int, list[list[Step]]] = {b: [] for b in budgets}  # a study per seed
        groups: dict[int, list[list[int]]] = {b: [] for b in budgets}  # packed: its rounds'
        for b in budgets:
            scaled = max(1, round(b * scale))  # B full trials' wall time, in full trials
            for seed in args.seeds:
                groups[b].append([])
                study = run_strategy(
                    *(t, m, seed, round(b * scale * t.rounds), TRIAL_CAP * scaled, scaled, cache),
                    pack=pack,
                    concurrent=wide,
                    groups=groups[b][-1],
                    refill_delay=args.refill_delay,
                )
                runs[b].append(study)
        search[name] = summarize(runs, grid, scale)
        search[name]["wall_s"] = time.perf_counter() - start
        if wide > 1:
            search[name]["concurrent"] = wide
        if wall:
            search[name]["wall_scale"] = scale  # its B: B · scale full trials' rounds
        if pack > 1:
            _, size, note = pack_plan(study_spec(t, m, 0, 1), pack)
            search[name]["pack"] = {"pack": pack, "size": size, "packed": size > 1, "note": note}
            search[name]["pack"]["vmapped_groups"] = vmapped_groups(groups[max(budgets)])
            search[name]["pack"]["refill_delay"] = args.refill_delay
        traces[name] = {str(b): [[s.to_row() for s in r] for r in rs] for b, rs in runs.items()}
        b = search[name]["by_budget"][str(max(budgets))]
        print(
            f"{task} {name}: gap@{max(budgets)} {b['median_gap']:+.3%}, 1% seeds "
            f"{b['seeds_within_1pct']}/{len(args.seeds)}, trials {b['median_trials']} "
            f"(stopped {b['median_stopped']}) {search[name]['wall_s']:.0f} s",
            file=sys.stderr,
        )
    return {
        "definition": st._document(task),
        "rounds": t.rounds,
        "grid": grid,
        "search": search,
        "traces": traces,
        "engine_rounds_run": cache.engine_rounds,
    }


def wall_scale(speed: dict[str, Any], task: str, pack: int) -> float:
    """The configuration-rounds a pack of ``pack`` runs in one unpacked configuration-round's
    wall time, on ``task`` (``search_pack_speed.py``'s median speed-up; 1 when it cannot pack).

    Args:
        speed: ``search_pack_speed.py``'s report.
        task: The suite's task.
        pack: Configurations per pack.

    Returns:
        The speed-up s.

    Raises:
        SystemExit: The report has no figure for that task and pack size.
    """
    entry = speed["tasks"].get(task)
    if entry is not None and not entry.get("packed", True):
        return 1.0
    size = (entry or {}).get("by_size", {}).get(str(pack))
    if size is None:
        raise SystemExit(f"--equal-wall: no speed-up measured for {task} at P = {pack}")
    return float(size["speedup"])


def verify(task: str, seed: int, strategy: str, trials: int) -> dict[str, Any]:
    """The same study through ``run_study`` and in-process: do the trials agree?"""
    import logging

    import optuna
    import ray

    from fedtune.tuning.driver.study import run_study

    t = st.Task(task)
    name = f"{task}-{strategy}-s{seed}".replace("_", "-")
    spec = st.task_spec(
        task,
        name,
        search={**t.spec.search.model_dump(exclude_none=True), "strategy": strategy},
        sampler={"seed": seed},
        scheduler={"grace_rounds": max(1, t.rounds // 6)},
        budget={"trials": trials, "max_concurrent": 1},
        report_every=1,
    )
    root = Path(tempfile.mkdtemp(prefix="ftv-", dir="/tmp"))
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    result = run_study(spec, root / "study")  # embedded Ray (with its start-up retries)
    ray.shutdown()
    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    real = [
        (t_.params, int(t_.user_attrs.get("rounds", 0)), t_.user_attrs.get("outcome"))
        for t_ in sorted(study.trials, key=lambda x: x.number)
    ]
    t.spec = t.spec.model_copy(update={"name": spec.name})
    sim = run_strategy(t, strategy, seed, 10**9, trials, trials, CurveCache(t))
    mine = [
        (
            s.point,
            s.rounds,
            "stopped"
            if s.value is None
            else "diverged"
            if not math.isfinite(s.value)
            else "completed",
        )
        for s in sim
    ]
    same = [
        a[1:] == b[1:] and all(math.isclose(a[0][k], b[0][k], rel_tol=1e-9) for k in a[0])
        for a, b in zip(real, mine, strict=False)
    ]
    return {
        "task": task,
        "seed": seed,
        "strategy": strategy,
        "trials": trials,
        "agree": all(same) and len(real) == len(mine),
        "per_trial_agree": same,
        "run_study": [[r, o] for _, r, o in real],
        "in_process": [[r, o] for _, r, o in mine],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--tasks",
        nargs="+",
        choices=[*st.TASKS, *st.HELD_OUT],
        default=list(st.TASKS),
        help="the suite by default; the held-out task only when named",
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32])
    p.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    p.add_argument(
        "--pack",
        type=int,
        nargs="+",
        default=[1],
        help="configurations per trial process (resources.pack); several: each is run",
    )
    p.add_argument(
        "--concurrent",
        type=int,
        default=1,
        help="unpacked trials at once (budget.max_concurrent) of the --pack 1 row: "
        "<strategy>@c<C> (1: the sequential <strategy>)",
    )
    p.add_argument(
        "--refill-delay",
        type=int,
        default=0,
        help="packed rows: rounds a refill waits before its round 1 while its pack runs on "
        "(the driver's lag: benchmarks/refill_lag.py measured 0 or 1)",
    )
    p.add_argument(
        "--equal-wall",
        type=lambda path: json.loads(Path(path).read_text()),
        metavar="SPEED",
        help="packed rows at the unpacked rows' wall time: search_pack_speed.py's report",
    )
    p.add_argument("--verify", nargs=4, metavar=("TASK", "SEED", "STRATEGY", "TRIALS"))
    p.add_argument("--table", action="store_true", help="print --out's table (markdown)")
    p.add_argument("--merge", type=Path, nargs="+", help="merge these reports' tasks into --out")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    command = "python benchmarks/search_efficiency.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if args.table:
        print(table(previous))
        if previous.get("packing"):
            print("\n" + packing_table(previous))
        return 0
    if previous.get("suite") != 1:  # the older two-task report: not merged
        previous = {"overhead": previous.get("overhead"), "startup": previous.get("startup")}
    if args.verify:
        task, seed, strategy, trials = args.verify
        previous.setdefault("verify", {})[f"{task}/{strategy}/s{seed}"] = {
            **verify(task, int(seed), strategy, int(trials)),
            "command": command,
        }
        args.out.write_text(json.dumps(finite_or_none(previous), indent=2, default=str))
        print(json.dumps(previous["verify"], indent=1, default=str))
        return 0
    tasks = dict(previous.get("tasks") or {})
    t0 = time.perf_counter()
    merged = [json.loads(f.read_text()) for f in args.merge or ()]
    for doc in merged:  # reports of processes that ran tasks (or strategies) side by side
        for name, entry in (doc.get("tasks") or {}).items():
            if name in tasks:
                for key in ("search", "traces"):
                    entry[key] = {**tasks[name][key], **entry[key]}
            tasks[name] = entry
        if doc.get("verify"):
            previous["verify"] = {**(previous.get("verify") or {}), **doc["verify"]}
        command = " ; ".join(d["command"] for d in merged if d.get("tasks"))

    def write() -> None:
        report = {
            "benchmark": "search_efficiency",
            "suite": 1,
            "environment": environment(),
            "path": "in-process (benchmarks/search_sim.py); see verify for the run_study check",
            "budgets_count": "rounds actually run: budget B = B x T rounds",
            "seeds": args.seeds,
            "budgets": args.budgets,
            "tasks": tasks,
            "overall": overall(tasks, args.budgets),
            "packing": packing(tasks, args.budgets) or None,
            "verify": previous.get("verify"),
            "overhead": previous.get("overhead"),
            "startup": previous.get("startup"),
            "wall_s": time.perf_counter() - t0,
            "load_average": os.getloadavg(),
            "command": command,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(finite_or_none(report), indent=2, default=str))

    for task in [] if merged else args.tasks:
        tasks[task] = run_task(task, args, tasks.get(task))
        write()
    if merged:
        first = next(d for d in merged if d.get("tasks"))
        args.seeds, args.budgets = first["seeds"], first["budgets"]
        write()
    print(json.dumps(finite_or_none(overall(tasks, args.budgets)), indent=1))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
