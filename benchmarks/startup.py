"""Study start-up and per-trial overhead: ``fedtune tune`` against plain Ray Tune + OptunaSearch.

The goal: a study's fixed cost (process start → first trial running) no more than plain
Ray Tune + ``OptunaSearch``'s on the same machine, and a per-trial overhead ≤ 0.1 s. Both are
run here side by side, interleaved, each as a fresh process (``subprocess``) per repeat, both
with a fresh embedded Ray:

* **plain** — a ``python -c`` script: ``ray.tune.Tuner`` (Ray started by ``fit`` with its
  defaults) with ``OptunaSearch`` on one uniform parameter, ``num_samples = N``,
  ``max_concurrent_trials = 1``, a function trainable that appends its start and end times to a
  stamp file and reports one value;
* **plain_torch** — the same script whose trainable imports torch first, as every PyTorch
  trainable does (fedtune's trial process imports its engine, hence torch, before its trainable
  runs): the same work as fedtune's first trial up to its start;
* **fedtune** — ``python -m fedtune.cli tune STUDY.yaml --workdir <fresh dir> --json`` on the
  equivalent trivial study (quadratic task with 1 client of dimension 1 and 1 example, 1 round,
  random sampler, no scheduler, ``budget.trials = N``, ``max_concurrent = 1``), with the real
  defaults: Optuna SQLite storage and MLflow SQLite store in the workdir. The environment
  variable ``FEDTUNE_TIMELINE`` (:mod:`fedtune.tuning.common.timeline`) makes the driver and the trial
  processes stamp their phases, so the fixed cost is split into: interpreter + CLI start, spec
  (imports of the engine), driver imports, Optuna storage, Ray start, MLflow store, Tuner
  construction, first trial scheduled (driver), trial process start → trainable entered.

Per run: ``fixed_s`` = first trial entered − process launch; ``total_s`` = process exit −
launch; the gaps: from one trial's last report (in the trial) to the next trial's entry, i.e.
everything the driver, Tune, Optuna and MLflow do per trial. Per variant, medians over
repeats: ``per_trial_overhead_s`` = the median gap (runs with the most trials); with several
``--trials`` values also ``per_trial_s_slope`` = (median total at N_max − at N_min) /
(N_max − N_min), which adds the trial's own work and the end-of-study work per trial.

``--profile-trials N`` adds a cProfile of one in-process ``run_study`` of the same study with N
trials: per trial, the SQLite commits (Optuna and MLflow, each an fsync) and the driver's time
in the searcher, the MLflow callback and Tune's actor reset — what the per-trial overhead is.

The MLflow store template (:mod:`fedtune.tuning.mlflow.sqlite_template`) is built before the
repeats (one extra run, reported as ``cold_template``), as any earlier study on the machine does.

Usage: ``python benchmarks/startup.py [--repeats 5] [--trials 6] [--profile-trials 12]
[--out PATH]``
(writes ``benchmarks/results/startup.json``).

**Whole process** (``--whole``; writes ``benchmarks/results/startup_whole.json``):
shell to exit, what a user pays for a small study. Interleaved, a fresh process and workdir
each time: ``fedtune tune`` (the installed script) on a 2-trial 3-round quadratic study
(:data:`WHOLE_STUDY`: fedavg space, TPE seeded, one trial at a time) against
:data:`PLAIN_WHOLE`, a script doing the same search with plain Ray Tune + ``OptunaSearch``
(the same two log-uniform learning rates, ``num_samples = 2``, one at a time, TPE seeded) whose
trainable imports torch and reports 3 rounds, then ``ray.shutdown()``. Per kind the median of
``total_s`` (launch → exit) and the ratio fedtune / plain (of the medians, and the median of the
interleaved pairs' ratios); fedtune's phases from its timeline (imports, stores, Ray start,
trials, report and plots, Ray's shutdown, exit); and at ``--overhead-trials`` (16) the
per-trial overhead (median gap from a trial's last report to the next trial's start) and the
slope of the totals. ``--concurrent N`` runs the same study N configurations at a time
(``budget.max_concurrent``, plain's ``max_concurrent_trials``): at N ≥ 2 ``fedtune`` is the
study as placed by cost (one pack in the driver's process, or Ray), ``fedtune_ray`` its Ray
Tune path.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment
from _studies import free_study

ROOT = Path(__file__).resolve().parent.parent
OUT = Path(__file__).resolve().parent / "results" / "startup.json"
OUT_WHOLE = OUT.with_name("startup_whole.json")

PLAIN = textwrap.dedent(
    """
    import os, sys, time
    n, stamps, TORCH = int(sys.argv[1]), sys.argv[2], sys.argv[4] == "torch"

    def stamp(what):
        with open(stamps, "a") as fh:
            fh.write(f"{what} {time.time()}\\n")

    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch
    stamp("imported")

    def process_start():
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))

    def trainable(config):
        if TORCH:
            import torch  # noqa: F401
        with open(stamps, "a") as fh:
            fh.write(f"trial_process_start {process_start()}\\n")
        stamp("trial_entered")
        tune.report({"loss": (config["x"] - 0.3) ** 2})
        stamp("trial_reported")

    tuner = tune.Tuner(
        trainable,
        param_space={"x": tune.uniform(0.0, 1.0)},
        tune_config=tune.TuneConfig(search_alg=OptunaSearch(metric="loss", mode="min", seed=0),
                                    num_samples=n, max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=sys.argv[3], verbose=0),
    )
    tuner.fit()
    ray.shutdown()
    """
)

STUDY = free_study("startup-probe", rounds=1, trials=1, sampler="random")

KINDS = ("plain", "plain_torch", "fedtune")

#: driver phases of the fedtune timeline, in order (a phase's time = its mark − the previous)
DRIVER_PHASES = (
    "cli",
    "spec_loaded",
    "driver_imported",
    "optuna_opened",
    "ray_started",
    "session_ready",
    "fit",
    "first_trial_scheduled",
)


def _stamps(path: Path) -> list[tuple[str, float, int]]:
    """(phase, time, pid) rows of a plain stamp file or a fedtune timeline (JSON lines)."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            if d["t"] is not None:
                rows.append((d["phase"], float(d["t"]), int(d["pid"])))
        elif line.strip():
            what, t = line.split()
            rows.append((what, float(t), 0))
    return rows


def _trial_times(rows: list[tuple[str, float, int]]) -> tuple[list[float], list[float]]:
    starts = sorted(t for p, t, _ in rows if p == "trial_entered")
    ends = sorted(t for p, t, _ in rows if p == "trial_reported")
    return starts, ends


def _timed(
    kind: str,
    n: int,
    cmd: list[str],
    env: dict[str, str],
    run_dir: Path,
    stamps: Path,
    packed: int = 1,
) -> tuple[float, float, float, list[tuple[str, float, int]], list[float], list[float]]:
    """Run ``cmd`` once, launch to exit: the 1-minute load before it, launch and end times, its
    stamps and the ``n`` trials' start and end times (RuntimeError when it failed). With
    ``packed`` configurations at most per trial (a pack enters its trainable once), at least
    ``ceil(n / packed)`` trials."""
    load = os.getloadavg()[0]
    launch = time.time()
    proc = subprocess.run(cmd, env=env, cwd=run_dir, capture_output=True, text=True)
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} N={n} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = _stamps(stamps)
    starts, ends = _trial_times(rows)
    if not -(-n // packed) <= len(starts) == len(ends) <= n:
        raise RuntimeError(f"{kind} N={n}: {len(starts)} trial starts, {len(ends)} ends")
    return load, launch, end, rows, starts, ends


def run_once(
    kind: str,
    n: int,
    scratch: Path,
    env: dict[str, str],
    wrap: Callable[[list[str]], list[str]] = list,
) -> dict[str, Any]:
    """One fresh process of ``kind`` (plain / fedtune) running ``n`` trials; ``wrap`` maps its
    command to the one run (the tests': a lean Ray, ``tests/lean_script.py``)."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"{kind}-{n}-", dir=scratch))
    stamps = run_dir / "stamps"
    env = dict(env)
    if kind.startswith("plain"):
        torch = "torch" if kind == "plain_torch" else "-"
        cmd = [
            sys.executable,
            "-c",
            PLAIN,
            str(n),
            str(stamps),
            str(run_dir / "ray_results"),
            torch,
        ]
    else:
        study = run_dir / "study.yaml"
        study.write_text(free_study("startup-probe", rounds=1, trials=n, sampler="random"))
        env["FEDTUNE_TIMELINE"] = str(stamps)
        cmd = [
            sys.executable,
            "-m",
            "fedtune.cli",
            "tune",
            str(study),
            "--workdir",
            str(run_dir / "w"),
            "--json",
        ]
    load, launch, end, rows, starts, ends = _timed(kind, n, wrap(cmd), env, run_dir, stamps)
    out: dict[str, Any] = {
        "kind": kind,
        "trials": n,
        "load_1min": round(load, 2),
        "fixed_s": starts[0] - launch,
        "total_s": end - launch,
        "trial_work_s": statistics.median(e - s for s, e in zip(starts, ends, strict=True)),
        "gaps_s": [b - a for a, b in zip(ends, starts[1:], strict=False)],
    }
    if kind.startswith("plain"):
        out["phases"] = {"imports": next(t for p, t, _ in rows if p == "imported") - launch}
        proc = min(t for p, t, _ in rows if p == "trial_process_start")
        out["phases"]["trial_process_start_to_entered"] = starts[0] - proc
        out["phases"]["trial_process_started_after_launch"] = proc - launch
    else:
        out["phases"] = fedtune_phases(rows, launch)
    return out


def fedtune_phases(rows: list[tuple[str, float, int]], launch: float) -> dict[str, float]:
    """Durations of the driver's phases and of the first trial's process start."""
    driver = min((pid for p, _, pid in rows if p == "cli"), default=None)
    marks = {p: t for p, t, pid in reversed(rows) if pid == driver}
    phases, last = {}, launch
    for name in DRIVER_PHASES:
        if name in marks:
            phases[name] = marks[name] - last
            last = marks[name]
    if "mlflow_opened" in marks:  # in a thread, concurrently with the phases above
        phases["mlflow_opened_after_launch"] = marks["mlflow_opened"] - launch
    if "early_ray" in marks:  # fedtune tune's Ray, started in a thread before the imports
        phases["ray_start_began_after_launch"] = marks["early_ray"] - launch
        if "early_ray_ready" in marks:
            phases["ray_start_s"] = marks["early_ray_ready"] - marks["early_ray"]
    trial = [(p, t) for p, t, pid in rows if pid != driver]
    entered = min(t for p, t in trial if p == "trial_entered")
    proc_start = min((t for p, t in trial if p == "trial_process_start"), default=None)
    phases["first_trial_scheduled_to_entered"] = entered - last
    if proc_start is not None:
        phases["trial_process_start_to_entered"] = entered - proc_start
        phases["trial_process_started_after_launch"] = proc_start - launch
    return phases


def summarize(runs: list[dict[str, Any]], kind: str, ns: list[int]) -> dict[str, Any]:
    mine = [r for r in runs if r["kind"] == kind]
    fixed = statistics.median(r["fixed_s"] for r in mine)
    totals = {n: statistics.median(r["total_s"] for r in mine if r["trials"] == n) for n in ns}
    lo, hi = min(ns), max(ns)
    slope = (totals[hi] - totals[lo]) / (hi - lo) if hi > lo else None
    work = statistics.median(r["trial_work_s"] for r in mine)
    gaps = [g for r in mine if r["trials"] == hi for g in r["gaps_s"]]
    phase_names = list(dict.fromkeys(k for r in mine for k in r["phases"]))
    phases = {
        k: statistics.median(r["phases"][k] for r in mine if k in r["phases"]) for k in phase_names
    }
    return {
        "fixed_s_median": fixed,
        "fixed_s_all": [round(r["fixed_s"], 3) for r in mine],
        "total_s_median": {str(n): totals[n] for n in ns},
        "per_trial_overhead_s": statistics.median(gaps) if gaps else None,
        "per_trial_s_slope": slope,
        "trial_work_s_median": work,
        "phases_s_median": phases,
    }


#: (file suffix, function) -> name in the per-trial profile
_PROFILED = {
    ("<method 'commit' of 'sqlite3.Connection' objects>", ""): "sqlite_commit",
    ("fedtune/tuning/optuna/searcher.py", "suggest"): "searcher_suggest (Optuna ask)",
    ("fedtune/tuning/optuna/searcher.py", "on_trial_complete"): "searcher_complete (Optuna tell)",
    ("fedtune/tuning/mlflow/callback.py", "on_trial_start"): "mlflow_trial_start",
    ("fedtune/tuning/mlflow/callback.py", "on_trial_result"): "mlflow_trial_result",
    ("fedtune/tuning/mlflow/callback.py", "on_trial_complete"): "mlflow_trial_complete",
    ("ray/tune/execution/tune_controller.py", "_on_trial_reset"): "tune_actor_reset",
}


def profile_per_trial(trials: int, scratch: Path) -> dict[str, Any]:
    """cProfile of one in-process study of ``trials`` trials: driver seconds per trial."""
    import cProfile
    import pstats

    import yaml

    from fedtune.tuning.driver.study import run_study
    from fedtune.tuning.spec import StudySpec

    doc = yaml.safe_load(STUDY)
    doc["budget"]["trials"] = trials
    profile = cProfile.Profile()
    profile.enable()
    result = run_study(StudySpec.from_dict(doc), scratch / "profiled")
    profile.disable()
    out: dict[str, Any] = {"trials": trials, "tuning_s": result.timings["tuning_s"]}
    for (file, _, func), (_, calls, tottime, cumtime, _) in pstats.Stats(profile).stats.items():
        for (suffix, name), label in _PROFILED.items():
            hit = func == suffix if not name else file.endswith(suffix) and func == name
            if hit:
                entry = out.setdefault(label, {"calls_per_trial": 0.0, "s_per_trial": 0.0})
                entry["calls_per_trial"] += calls / trials
                entry["s_per_trial"] += (tottime if not name else cumtime) / trials
    return out


#: what each phase of the fedtune timeline is (the gap's explanation refers to these)
PHASES = {
    "cli": "interpreter start, `fedtune` CLI (fedtune.tuning imports nothing heavy)",
    "ray_start_began_after_launch": "launch → the embedded Ray's start begins (EarlyRay's "
    "thread, before the imports below; it runs concurrently with them)",
    "ray_start_s": "the embedded Ray's start in that thread (ray import, ray.init)",
    "spec_loaded": "StudySpec.from_file: the engine's imports (torch), YAML, search space, "
    "validation",
    "driver_imported": "import fedtune.tuning.driver.study: Ray, Ray Tune (searcher), Optuna",
    "optuna_opened": "study lock, Optuna RDB storage (SQLite) and study; for a new study in "
    "the stores' thread, concurrently with Ray's start",
    "ray_started": "waiting for the embedded Ray (started early, see ray_start_s) and the "
    "resource check; MLflow import, store (template copy) and parent run in the stores' "
    "thread meanwhile",
    "session_ready": "waiting for the Optuna storage's thread after Ray started",
    "mlflow_opened_after_launch": "launch → MLflow store and parent run open (a thread; the "
    "MLflow callback waits for it at the first trial's start, not before Tune's set-up)",
    "fit": "Tuner construction",
    "first_trial_scheduled": "Tune's set-up until the first trial starts (driver side)",
    "trial_process_start_to_entered": "the trial's Ray worker: interpreter, Ray, Ray Tune, "
    "then unpickling the spec and the trainable imports fedtune's engine and torch",
}


def derive(report: dict[str, Any]) -> None:
    """Summary per variant, the goal and the gap's breakdown, from ``report["runs"]``."""
    runs, kinds = report["runs"], sorted({r["kind"] for r in report["runs"]})
    ns = sorted({r["trials"] for r in runs})
    report["summary"] = {k: summarize(runs, k, ns) for k in kinds}
    report["phases_meaning"] = PHASES
    if not {"plain", "fedtune"} <= set(kinds):
        return
    f, pl = report["summary"]["fedtune"], report["summary"]["plain"]
    report["goal"] = {
        "fixed_ratio_fedtune_over_plain": f["fixed_s_median"] / pl["fixed_s_median"],
        "fixed_met": f["fixed_s_median"] <= pl["fixed_s_median"],
        "per_trial_overhead_met": (f["per_trial_overhead_s"] or 0.0) <= 0.1,
        "per_trial_overhead_ratio_fedtune_over_plain": f["per_trial_overhead_s"]
        / pl["per_trial_overhead_s"],
    }
    ph = f["phases_s_median"]
    before = ph.get("ray_start_began_after_launch")
    if before is None:  # Ray started after the imports (the driver path before EarlyRay)
        before = sum(ph.get(k, 0.0) for k in ("cli", "spec_loaded", "driver_imported"))
    worker = ph.get("trial_process_start_to_entered", 0.0)
    report["gap"] = {
        "fixed_gap_s": f["fixed_s_median"] - pl["fixed_s_median"],
        "before_ray_start_s": {"fedtune": before, "plain": pl["phases_s_median"]["imports"]},
        "ray_start_to_first_trial_s": {
            "fedtune": f["fixed_s_median"] - before,
            "plain": pl["fixed_s_median"] - pl["phases_s_median"]["imports"],
            "fedtune_trial_process_start_to_entered": worker,
            "plain_trial_process_start_to_entered": pl["phases_s_median"].get(
                "trial_process_start_to_entered"
            ),
        },
    }
    if "plain_torch" in report["summary"]:  # the same work up to the first trial's start
        pt = report["summary"]["plain_torch"]
        report["goal"]["fixed_ratio_fedtune_over_plain_torch"] = (
            f["fixed_s_median"] / pt["fixed_s_median"]
        )
        report["goal"]["same_work_fixed_met"] = f["fixed_s_median"] <= pt["fixed_s_median"]
        report["gap"]["ray_start_to_first_trial_s"][
            "plain_torch_trial_process_start_to_entered"
        ] = pt["phases_s_median"].get("trial_process_start_to_entered")


# -- the whole process -------------------------------------------------------------------

PLAIN_WHOLE = textwrap.dedent(
    """
    import os, sys, time
    n, rounds, stamps, storage = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    concurrent = int(sys.argv[5])

    def stamp(what):
        with open(stamps, "a") as fh:
            fh.write(f"{what} {time.time()}\\n")

    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch
    stamp("imported")

    def trainable(config):
        import torch
        stamp("trial_entered")
        w = torch.zeros(1, dtype=torch.float64)
        for r in range(1, rounds + 1):
            w = w - config["server_lr"] * config["client_lr"] * (w - 1.0)
            tune.report({"loss": float((w - 1.0).square()), "round": r})
        stamp("trial_reported")

    space = {"client_lr": tune.loguniform(1e-3, 10.0), "server_lr": tune.loguniform(1e-3, 10.0)}
    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(search_alg=OptunaSearch(metric="loss", mode="min", seed=0),
                                    num_samples=n, max_concurrent_trials=concurrent),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
    )
    tuner.fit()
    stamp("fit_done")
    ray.shutdown()
    stamp("ray_stopped")
    """
)

WHOLE_STUDY = free_study("whole-process", rounds=3, trials=2, sampler="tpe")

#: plain Ray Tune; ``fedtune tune`` as a user runs it (this study trains one configuration at a
#: time on the CPU: its trials run in the driver's process, no Ray); ``fedtune tune --ray``
WHOLE_KINDS = ("plain_torch", "fedtune", "fedtune_ray")

#: what each whole-process phase of fedtune is (durations unless "_after_launch")
WHOLE_PHASES = {
    "interpreter_cli": "launch → `fedtune tune` parsed its arguments (interpreter, CLI)",
    "spec_loaded": "StudySpec.from_file: YAML, search space, the engine's imports (torch)",
    "driver_imported": "import fedtune.tuning.driver.study (Ray Tune, Optuna)",
    "ray_start_s": "the embedded Ray's start, in a thread from launch (overlaps the above)",
    "optuna_opened_after_launch": "the Optuna storage open (a thread)",
    "mlflow_opened_after_launch": "the MLflow store and parent run open (a thread)",
    "first_trial_entered_after_launch": "launch → the first trial's code runs",
    "trials": "first trial entered → Tune's fit returned (all trials)",
    "ray_stop_s": "Ray's shutdown after the fit (in its thread, waited for before the report)",
    "report_s": "trade-off analysis, tradeoff/*.json/csv and the plots (PNG)",
    "mlflow_report_s": "MLflow: best.json, trials_table.json, tradeoff/ artifacts, metrics",
    "exit_s": "report done → process gone (summary, the lock released, atexit, exit)",
}


def _fedtune_cmd(study: Path, workdir: Path) -> list[str]:
    """``fedtune tune`` as a shell runs it: the installed script beside this Python."""
    script = Path(sys.executable).parent / "fedtune"
    head = [str(script)] if script.is_file() else [sys.executable, "-m", "fedtune.cli"]
    return [*head, "tune", str(study), "--workdir", str(workdir), "--json"]


def run_whole(
    kind: str,
    n: int,
    rounds: int,
    scratch: Path,
    env: dict[str, str],
    concurrent: int = 1,
    wrap: Callable[[list[str]], list[str]] = list,
) -> dict:
    """One fresh process of ``kind`` (plain_torch / fedtune), ``n`` trials of ``rounds``
    rounds, ``concurrent`` at a time, timed from launch to exit, with its phases; ``wrap`` as
    :func:`run_once`'s."""
    run_dir = Path(tempfile.mkdtemp(prefix=f"whole-{kind}-{n}-", dir=scratch))
    stamps = run_dir / "stamps"
    env = dict(env)
    if kind == "plain_torch":
        cmd = [
            sys.executable,
            "-c",
            PLAIN_WHOLE,
            str(n),
            str(rounds),
            str(stamps),
            str(run_dir / "ray_results"),
            str(concurrent),
        ]
    else:
        study = run_dir / "study.yaml"
        study.write_text(
            free_study(
                "whole-process", rounds=rounds, trials=n, sampler="tpe", max_concurrent=concurrent
            )
        )
        env["FEDTUNE_TIMELINE"] = str(stamps)
        cmd = _fedtune_cmd(study, run_dir / "w") + (["--ray"] if kind == "fedtune_ray" else [])
    load, launch, end, rows, starts, ends = _timed(
        kind, n, wrap(cmd), env, run_dir, stamps, concurrent
    )
    out = {
        "kind": kind,
        "trials": n,
        "rounds": rounds,
        "trial_processes": len(starts),
        "load_1min": round(load, 2),
        "total_s": end - launch,
        "fixed_s": starts[0] - launch,
        "gaps_s": [b - a for a, b in zip(ends, starts[1:], strict=False)],
    }
    out["phases"] = whole_phases(kind, rows, launch, end, starts[0])
    return out


def whole_phases(
    kind: str, rows: list[tuple[str, float, int]], launch: float, end: float, entered: float
) -> dict[str, float]:
    """The run's phases (:data:`WHOLE_PHASES`; plain: imports, trials, shutdown, exit)."""
    if kind == "plain_torch":
        m = {p: t for p, t, _ in rows}
        return {
            "imports": m["imported"] - launch,
            "first_trial_entered_after_launch": entered - launch,
            "trials": m["fit_done"] - entered,
            "ray_stop_s": m["ray_stopped"] - m["fit_done"],
            "exit_s": end - m["ray_stopped"],
        }
    driver = min((pid for p, _, pid in rows if p == "cli"), default=None)
    m = {p: t for p, t, pid in reversed(rows) if pid == driver}
    spans = {
        "interpreter_cli": (launch, m.get("cli")),
        "spec_loaded": (m.get("cli"), m.get("spec_loaded")),
        "driver_imported": (m.get("spec_loaded"), m.get("driver_imported")),
        "ray_start_s": (m.get("early_ray"), m.get("early_ray_ready")),
        "optuna_opened_after_launch": (launch, m.get("optuna_opened")),
        "mlflow_opened_after_launch": (launch, m.get("mlflow_opened")),
        "first_trial_entered_after_launch": (launch, entered),
        "trials": (entered, m.get("fit_done")),
        "ray_stop_s": (m.get("fit_done"), m.get("ray_stopped")),
        "report_s": (m.get("finalize"), m.get("report_written")),
        "mlflow_report_s": (m.get("report_written"), m.get("finalized")),
        "exit_s": (m.get("finalized"), end),
    }
    return {k: b - a for k, (a, b) in spans.items() if a is not None and b is not None}


def derive_whole(report: dict[str, Any]) -> None:
    """Medians per kind and trial count, the ratio, the per-trial overhead."""
    runs = report["runs"]
    ns = sorted({r["trials"] for r in runs})
    small = min(ns)
    summary: dict[str, Any] = {}
    for kind in sorted({r["kind"] for r in runs}):
        mine = [r for r in runs if r["kind"] == kind]
        entry: dict[str, Any] = {}
        for n in ns:
            at = [r for r in mine if r["trials"] == n]
            if not at:
                continue
            names = list(dict.fromkeys(k for r in at for k in r["phases"]))
            gaps = [g for r in at for g in r["gaps_s"]]
            entry[str(n)] = {
                "runs": len(at),
                "total_s_median": statistics.median(r["total_s"] for r in at),
                "total_s_all": [round(r["total_s"], 3) for r in at],
                "per_trial_overhead_s": statistics.median(gaps) if gaps else None,
                "phases_s_median": {
                    k: statistics.median(r["phases"][k] for r in at if k in r["phases"])
                    for k in names
                },
            }
        if len(entry) > 1:
            lo, hi = entry[str(small)], entry[str(max(ns))]
            entry["per_trial_s_slope"] = (hi["total_s_median"] - lo["total_s_median"]) / (
                max(ns) - small
            )
        summary[kind] = entry
    report["summary"] = summary
    report["phases_meaning"] = WHOLE_PHASES
    if not {"plain_torch", "fedtune"} <= summary.keys():
        return
    f, p = summary["fedtune"][str(small)], summary["plain_torch"][str(small)]
    pairs = {}  # interleaved repeat -> {kind: total}
    for r in runs:
        if r["trials"] == small:
            pairs.setdefault(r["repeat"], {})[r["kind"]] = r["total_s"]
    ratios = [
        v["fedtune"] / v["plain_torch"]
        for v in pairs.values()
        if {"fedtune", "plain_torch"} <= v.keys()
    ]
    big = summary["fedtune"].get(str(max(ns)), {})
    report["goal"] = {
        "trials": small,
        "ratio_fedtune_over_plain_torch": f["total_s_median"] / p["total_s_median"],
        "ratio_of_interleaved_pairs_median": statistics.median(ratios) if ratios else None,
        "half_of_plain_met": f["total_s_median"] <= 0.5 * p["total_s_median"],
        "whole_process_met": f["total_s_median"] <= p["total_s_median"],
        "per_trial_overhead_s": big.get("per_trial_overhead_s"),
        "per_trial_overhead_trials": max(ns),
        "per_trial_overhead_met": (big.get("per_trial_overhead_s") or 0.0) <= 0.1,
    }
    if "fedtune_ray" in summary:  # the same study through Ray Tune (``--ray``)
        r = summary["fedtune_ray"][str(small)]
        report["goal"]["ratio_fedtune_ray_over_plain_torch"] = (
            r["total_s_median"] / p["total_s_median"]
        )


def main_whole(args: argparse.Namespace, env: dict[str, str]) -> int:
    started = time.time()
    report: dict[str, Any] = {
        "benchmark": "startup_whole",
        "environment": environment(),
        "settings": {
            "repeats": args.repeats,
            "trials": args.trials,
            "rounds": args.rounds,
            "concurrent": args.concurrent,
            "overhead_trials": args.overhead_trials,
            "overhead_repeats": args.overhead_repeats,
            "study": WHOLE_STUDY,
            "plain": PLAIN_WHOLE,
        },
    }
    plan = [(rep, n) for rep in range(args.repeats) for n in args.trials]
    if args.overhead_trials:
        plan += [(args.repeats + rep, args.overhead_trials) for rep in range(args.overhead_repeats)]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedtune-whole-") as tmp:
        scratch = Path(tmp)
        warm = run_whole("fedtune", 1, 1, scratch, env)  # the MLflow store template, once
        report["warm_up"] = {"total_s": warm["total_s"]}
        for rep, n in plan:
            kinds = WHOLE_KINDS if rep % 2 == 0 else tuple(reversed(WHOLE_KINDS))
            for kind in kinds:
                r = run_whole(kind, n, args.rounds, scratch, env, args.concurrent)
                r["repeat"] = rep
                runs.append(r)
                print(
                    f"{kind:11s} N={n} total {r['total_s']:.2f} s (load {r['load_1min']})",
                    file=sys.stderr,
                    flush=True,
                )
    report["runs"] = runs
    derive_whole(report)
    report["load_average_at_end"] = list(os.getloadavg())
    report["wall_s"] = time.time() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"summary": report["summary"], "goal": report.get("goal")}, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--trials", type=int, nargs="+", default=[6])
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--profile-trials", type=int, default=12, help="0: no profile")
    p.add_argument(
        "--out", type=Path, default=None, help=f"default: {OUT} ({OUT_WHOLE.name} with --whole)"
    )
    p.add_argument(
        "--whole",
        action="store_true",
        help="whole process (shell to exit) of fedtune tune vs plain Ray Tune",
    )
    p.add_argument("--rounds", type=int, default=3, help="--whole: rounds per trial")
    p.add_argument(
        "--concurrent",
        type=int,
        default=1,
        help="--whole: configurations at a time (budget.max_concurrent, max_concurrent_trials)",
    )
    p.add_argument(
        "--overhead-trials",
        type=int,
        default=16,
        help="--whole: trials of the per-trial overhead runs (0: none)",
    )
    p.add_argument("--overhead-repeats", type=int, default=2)
    p.add_argument(
        "--resummarize",
        action="store_true",
        help="recompute summary, goal and gap of the runs in --out (no new runs)",
    )
    args = p.parse_args(argv)
    if args.out is None:
        args.out = OUT_WHOLE if args.whole else OUT
    if args.resummarize:
        report = json.loads(args.out.read_text())
        (derive_whole if report["benchmark"] == "startup_whole" else derive)(report)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps({k: report.get(k) for k in ("summary", "goal", "gap")}, indent=2))
        return 0

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if args.whole:
        if args.trials == [6]:  # the default of the start-up mode
            args.trials = [2]
        return main_whole(args, env)
    started = time.time()
    report: dict[str, Any] = {
        "benchmark": "startup",
        "environment": environment(),
        "settings": {
            "repeats": args.repeats,
            "trials": args.trials,
            "study": STUDY,
            "plain": PLAIN,
        },
    }
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fedtune-startup-") as tmp:
        scratch = Path(tmp)
        if "fedtune" in args.kinds:
            report["cold_template"] = run_once("fedtune", 1, scratch, env)
        for rep in range(args.repeats):
            for n in args.trials:
                kinds = args.kinds if rep % 2 == 0 else list(reversed(args.kinds))
                for kind in kinds:
                    r = run_once(kind, n, scratch, env)
                    r["repeat"] = rep
                    runs.append(r)
                    print(
                        f"{kind:8s} N={n} fixed {r['fixed_s']:.2f} s total {r['total_s']:.2f}"
                        f" s (load {r['load_1min']})",
                        file=sys.stderr,
                        flush=True,
                    )
        if args.profile_trials:
            report["per_trial_profile"] = profile_per_trial(args.profile_trials, scratch)
    report["runs"] = runs
    derive(report)
    report["load_average_at_end"] = list(os.getloadavg())
    report["wall_s"] = time.time() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"summary": report["summary"], "goal": report.get("goal")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
