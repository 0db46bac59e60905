"""Where a K = 1 engine round's time goes: thread CPU time per phase, beside the baselines.

One trainer per runner (digits, 100 clients, FedAvg, M clients, K = 1, B = 20, 1 torch thread,
as ``engine_throughput.py``); the engine's phase functions are wrapped with timers of
``time.thread_time`` (CPU time of this thread: another process on the same cores slows it less
than wall time, the figure a loaded machine can still compare). After ``--warmup`` (20) rounds,
``--rounds`` rounds per runner; each phase's mean µs per round, the round's mean, and the
baselines' rounds (``plain``, ``fedavg_loop`` of ``engine_throughput.py``) timed the same way,
with the minimum over ``--samples`` blocks of rounds beside the mean. Where the clients' first
local steps give ℓ_t (``fedtune.trainers.first_step``) there is no ``lt_eval`` phase (0 µs,
``lt_from_first_step`` true); ``--separate-lt`` makes the engine take its separate ℓ_t pass.

Usage::

    python benchmarks/engine_round_phases.py [--models linear,mlp] [--m 10] [--separate-lt]
        [--out FILE]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_throughput as et
from _env import environment

from fedtune.trainers import engine as engine_mod
from fedtune.trainers import runners as runners_mod
from fedtune.trainers.algorithms import local_update

#: (module or class, attribute, phase): cohort (its draw and batch rows inside), ℓ_t, the
#: clients' local steps (the runner), the aggregation and the update's norm
PHASES = (
    (engine_mod.Trainer, "_cohort", "cohort"),
    (engine_mod, "sample_clients", "cohort_draw"),
    (engine_mod, "cohort_rows", "batch_rows"),
    (engine_mod, "client_mean_losses", "lt_eval"),
    (runners_mod.VectorizedRunner, "map", "local_steps"),
    (runners_mod.SequentialRunner, "map", "local_steps"),
    (local_update, "weighted_mean", "aggregate"),
    (local_update, "tree_norm", "update_norm"),
)


PHASE_NAMES = tuple(dict.fromkeys(phase for _, _, phase in PHASES))


def instrument(spent: collections.Counter) -> Callable[[], None]:
    """Wrap every phase function with a thread-time timer adding to ``spent``; give the call
    that puts the originals back."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _ in PHASES]
    for owner, name, phase in PHASES:
        inner = getattr(owner, name)

        def timed(*args, _inner=inner, _phase=phase, **kwargs):
            start = time.thread_time()
            try:
                return _inner(*args, **kwargs)
            finally:
                spent[_phase] += time.thread_time() - start

        setattr(owner, name, timed)

    def restore() -> None:
        for owner, name, inner in originals:
            setattr(owner, name, inner)

    return restore


def cpu_per_round(fn, rounds: int, samples: int) -> tuple[float, float]:
    """Mean and minimum (over ``samples`` blocks) thread time of one call, in µs."""
    per = []
    for _ in range(samples):
        start = time.thread_time()
        for _ in range(rounds):
            fn()
        per.append((time.thread_time() - start) / rounds)
    return round(sum(per) / len(per) * 1e6, 1), round(min(per) * 1e6, 1)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="linear,mlp")
    parser.add_argument("--m", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=600)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--separate-lt", action="store_true", help="ℓ_t by its own pass, not the first steps"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = round(os.getloadavg()[0], 2)
    spent: collections.Counter = collections.Counter()
    restore = instrument(spent)
    try:
        cells = measure(args, spent)
    finally:
        restore()
    doc = {
        "benchmark": "engine_round_phases",
        "units": "thread CPU µs per round (mean over the rounds; baselines also min of blocks)",
        "setting": {
            "M": args.m,
            "K": 1,
            "B": et.B,
            "rounds": args.rounds,
            "threads": 1,
            "separate_lt": args.separate_lt,
        },
        "environment": environment(),
        "load_average_1min": [load_before, round(os.getloadavg()[0], 2)],
        "cells": cells,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=2))
    return doc


def measure(args: argparse.Namespace, spent: collections.Counter) -> dict:
    """Each model's cell: the two runners' phases and the baselines' rounds."""
    cells = {}
    for model in args.models.split(","):
        task = et.digits_task(model)
        cfg = {"name": "digits", "clients": et.CLIENTS, "dirichlet": 0.5, "model": model}
        cell = {}
        for runner in ("vectorized", "sequential"):
            fn = et.engine_round(task, {**cfg, "seed": 0}, runner, args.m, 1)
            fn.trainer.measure_in_first_step = not args.separate_lt
            for _ in range(args.warmup):
                fn()
            spent.clear()
            start = time.thread_time()
            for _ in range(args.rounds):
                fn()
            total = time.thread_time() - start
            phases = {k: round(spent[k] / args.rounds * 1e6, 1) for k in PHASE_NAMES}
            inner = sum(phases[k] for k in ("cohort", "lt_eval", "local_steps", "aggregate"))
            phases["rest"] = round(total / args.rounds * 1e6 - inner - phases["update_norm"], 1)
            cell[runner] = {
                "round_us": round(total / args.rounds * 1e6, 1),
                "phases_us": phases,
                "lt_from_first_step": spent["lt_eval"] == 0,
            }
        baselines = {"plain": et.plain_round(task, args.m, 1)}
        baselines["fedavg_loop"] = et.fedavg_loop_round(task, args.m, 1)
        for name, fn in baselines.items():
            for _ in range(args.warmup):
                fn()
            mean, low = cpu_per_round(fn, args.rounds // args.samples, args.samples)
            cell[name] = {"round_us": mean, "min_round_us": low}
        cells[f"{model}/{args.m}/1"] = cell
        print(model, json.dumps(cell), flush=True)
    return cells


if __name__ == "__main__":
    main()
