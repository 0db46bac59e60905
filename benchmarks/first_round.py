"""The first round at large populations: task builders and round 1's cost.

Two measurements, each the median of ``--repeats`` runs in this process:

* ``builders``: seconds to build each vectorized built-in task at ``--clients`` (100,000 and
  1,000,000 by default) clients with small per-client data, and, side by side at
  ``--loop-clients`` clients, the per-client loops they replaced
  (``benchmarks/_loop_builders.py``, the same data bit for bit) — the old behaviour;
* ``first_round``: seconds of round 1 — which evaluates the training population — of FedAvg
  (M = 10, K = 10, B = 20, float32) with ``train.eval_population`` ``full`` (every client, the old
  behaviour and the default), ``sample`` (``--eval-clients`` clients) and ``off``, and of round 2
  (no evaluation) for reference, on the ``quadratic`` task (d = 2, 4 examples per client) and the
  ``synthetic`` task (d = 10, 5 classes, 3 + ⌊LogNormal(0, 0.5)⌋ examples) at ``--clients``.

The machine is shared (2 CPUs): the JSON records the load average before and after. Usage:
``python benchmarks/first_round.py [--clients 100000 1000000] [--loop-clients 100000]
[--repeats 5] [--eval-clients 1000]``. Writes ``benchmarks/results/first_round.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

from fedtune.trainers import Trainer, build_task

HERE = Path(__file__).resolve().parent

#: small per-client data, so that a million clients fit in memory
BUILDERS: dict[str, tuple[str, dict]] = {
    "quadratic_d2": ("quadratic", {"dim": 2, "examples": 4}),
    "quadratic_d2_unequal": (
        "quadratic",
        {"dim": 2, "examples": 2, "examples_max": 6, "noise": 0.1},
    ),
    "quadratic_d5": ("quadratic", {"dim": 5, "examples": 2}),
    "linreg_interp": ("linreg_interp", {"dim": 5, "examples": 5}),
    "synthetic": (
        "synthetic",
        {
            "dim": 10,
            "classes": 5,
            "min_examples": 3,
            "log_mean_examples": 0.0,
            "log_std_examples": 0.5,
            "max_examples": 20,
        },
    ),
    "mixed_labels": ("mixed_labels", {"examples": 5}),
    "mixed_quadratic": ("mixed_quadratic", {"examples": 4, "dim": 2, "iid": False}),
}
ROUND_TASKS = ("quadratic_d2", "synthetic")


def _loops():
    spec = importlib.util.spec_from_file_location("loop_builders", HERE / "_loop_builders.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def timed(fn: Callable[[], object], repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return {"median_s": round(statistics.median(times), 4), "runs_s": [round(t, 4) for t in times]}


def builders(clients: list[int], loop_clients: int, repeats: int) -> dict:
    loops = _loops()
    old = {
        "quadratic_d2": lambda n: loops.quadratic_loop(
            {"clients": n, **BUILDERS["quadratic_d2"][1]}, 0
        ),
        "quadratic_d5": lambda n: loops.quadratic_loop(
            {"clients": n, **BUILDERS["quadratic_d5"][1]}, 0
        ),
        "linreg_interp": lambda n: loops.linreg_loop(
            {"clients": n, **BUILDERS["linreg_interp"][1]}, 0
        ),
        "synthetic": lambda n: loops.synthetic_task_loop(
            {"clients": n, **BUILDERS["synthetic"][1]}, 0
        ),
    }
    out: dict = {}
    for key, (task, params) in BUILDERS.items():
        out[key] = {"task": task, "params": params}
        for n in clients:
            r = timed(lambda t=task, p=params, n=n: build_task(t, {**p, "clients": n}, 0), repeats)
            out[key][str(n)] = r
            print(f"builder {key} {n}: {r['median_s']} s", flush=True)
        if key in old and loop_clients:
            new = timed(
                lambda t=task, p=params: build_task(t, {**p, "clients": loop_clients}, 0), repeats
            )
            loop = timed(lambda k=key: old[k](loop_clients), repeats)
            out[key]["loop_vs_vectorized"] = {
                "clients": loop_clients,
                "loop": loop,
                "vectorized": new,
                "speedup": round(loop["median_s"] / new["median_s"], 1),
            }
            print(f"builder {key} loop {loop_clients}: {loop['median_s']} s", flush=True)
    return out


def round_config(task: str, params: dict, n: int, eval_population: str, s: int) -> dict:
    return {
        "task": {"name": task, "seed": 0, **params, "clients": n},
        "algorithm": "fedavg",
        "train": {
            "rounds": 3,
            "clients_per_round": 10,
            "local_steps": 10,
            "batch_size": 20,
            "eval_every": 1000,
            "eval_population": eval_population,
            "eval_clients": s if eval_population == "sample" else None,
            "dtype": "float32",
            "device": "cpu",
        },
        "hparams": {"client_lr": 0.01, "server_lr": 1.0},
        "seed": 0,
    }


def first_round(clients: list[int], repeats: int, s: int) -> dict:
    out: dict = {}
    for key in ROUND_TASKS:
        task_name, params = BUILDERS[key]
        out[key] = {}
        for n in clients:
            task = build_task(task_name, {**params, "clients": n}, 0)
            row: dict = {"examples": task.train.num_examples}
            Trainer(round_config(task_name, params, n, "off", s), task=task).step()  # warm-up
            for mode in ("full", "sample", "off"):
                config = round_config(task_name, params, n, mode, s)
                firsts, seconds = [], []
                for _ in range(repeats):
                    trainer = Trainer(config, task=task)
                    start = time.perf_counter()
                    record = trainer.step()
                    firsts.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    trainer.step()
                    seconds.append(time.perf_counter() - start)
                row[mode] = {
                    "round1_median_s": round(statistics.median(firsts), 4),
                    "round1_runs_s": [round(t, 4) for t in firsts],
                    "round2_median_s": round(statistics.median(seconds), 4),
                    "eval_clients": record.extra["eval_clients"],
                    "train_loss": record.train_loss,
                }
                print(f"round 1 {key} {n} {mode}: {row[mode]['round1_median_s']} s", flush=True)
            row["full_over_sample"] = round(
                row["full"]["round1_median_s"] / row["sample"]["round1_median_s"], 1
            )
            row["full_over_off"] = round(
                row["full"]["round1_median_s"] / row["off"]["round1_median_s"], 1
            )
            out[key][str(n)] = row
            del task
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--loop-clients", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--eval-clients", type=int, default=1000)
    parser.add_argument("--skip", choices=["builders", "rounds"], default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "first_round.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict = {
        "benchmark": "first_round",
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": environment(),
    }
    if args.skip != "builders":
        results["builders"] = builders(args.clients, args.loop_clients, args.repeats)
    if args.skip != "rounds":
        results["first_round"] = first_round(args.clients, args.repeats, args.eval_clients)
    results["environment"]["load_average_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
