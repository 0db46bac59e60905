"""Engine throughput: the runners against plain PyTorch on a grid of cohort sizes and local steps.

CPU mode (default). For the digits task's ``linear``, ``mlp`` and
``cnn`` models, M ∈ {10, 50, 100} clients per round and K ∈ {1, 10, 50} local steps (B = 20,
FedAvg, 100 clients), rounds per second of:

* ``vectorized`` — the engine with the torch.func vmap runner,
* ``sequential`` — the engine with the per-client loop (eager client path),
* ``auto`` is not timed: the cell records which of the two ``runner: auto`` picks
  (:func:`fedtune.trainers.runners.choose_runner`),
* ``plain`` — a plain PyTorch loop (nn.Module + torch.optim.SGD) doing the same M·K steps of
  batch B on pooled data,
* ``fedavg_loop`` — a hand-written FedAvg: the same cohort (same clients), for each client
  load the global weights into an nn.Module, K steps of torch.optim.SGD on batches of its
  data, then average the local models;
* ``fedavg_loop_lt`` — the same loop doing the same work as the engine: each client's mean
  loss on all its data at the global weights (no_grad) before its local steps.

A round of the engine also evaluates ℓ_t (each sampled client's loss on all its data before
training, part of every round of the papers' protocol: Charles & Konečný 2020 (arXiv:2007.00878)
§9); the first two baselines do not, ``fedavg_loop_lt`` does. Population
evaluation is off. Each sample times a number of rounds chosen so that one sample takes about
``--target`` seconds (calibrated on one round), after two warm-up rounds; the methods take turns
within a repeat, and a cell's numbers are the medians over ``--repeats``. Every cell records the
1-minute load average before and after it.

Goals per cell: ``req1`` sequential ≥ fedavg_loop (and, reported beside it, sequential ≥
fedavg_loop_lt: the same work); ``req2`` vectorized ≥ plain, or ``auto``
picks a runner that is ≥ plain. Where a goal is not met the cell gets a cProfile top-k of the
slower engine path, which says where the time goes.

CUDA mode (``--device cuda``): vectorized vs sequential at M = 50 for
the digits CNN and ResNet-18 (GroupNorm, 11 M parameters) on 32×32×3 synthetic images; records
``torch.cuda.get_device_name``. Results go to ``engine_throughput_cuda.json``.

Usage::

    python benchmarks/engine_throughput.py [--repeats 5] [--target 0.4]
    python benchmarks/engine_throughput.py --update cnn/50/10,linear/*/1   # re-run some cells
    python benchmarks/engine_throughput.py --markdown                     # README table
    python benchmarks/engine_throughput.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import fnmatch
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment, sync

from fedtune.trainers import Trainer, build_task
from fedtune.trainers.runners import choose_runner
from fedtune.trainers.sampling import sample_clients
from fedtune.trainers.tasks.base import Dataset, InMemoryData, Task
from fedtune.trainers.tasks.losses import accuracy, cross_entropy

RESULTS = Path(__file__).parent / "results"
MODELS = ("linear", "mlp", "cnn")
MS = (10, 50, 100)
KS = (1, 10, 50)
B = 20
CLIENTS = 100
LR = 0.05
METHODS = ("vectorized", "sequential", "plain", "fedavg_loop", "fedavg_loop_lt")


def digits_task(model: str) -> Task:
    return build_task("digits", {"clients": CLIENTS, "dirichlet": 0.5, "model": model}, seed=0)


def config(task: dict, runner: str, m: int, k: int, device: str = "cpu") -> dict:
    return {
        "task": task,
        "algorithm": "fedavg",
        "train": {
            "rounds": 10**6,
            "clients_per_round": m,
            "local_steps": k,
            "batch_size": B,
            "eval_every": 10**6,
            "eval_population": "off",
            "runner": runner,
            "device": device,
        },
        "hparams": {"client_lr": LR, "server_lr": LR},
    }


# -- one round of each method -------------------------------------------------------------------
def engine_round(task: Task, task_cfg: dict, runner: str, m: int, k: int, device="cpu"):
    trainer = Trainer(config(task_cfg, runner, m, k, device), task=task)

    def one_round() -> None:
        trainer.step()

    one_round.trainer = trainer  # type: ignore[attr-defined]
    return one_round


def plain_round(task: Task, m: int, k: int) -> Callable[[], None]:
    """M·K SGD steps of batch B on the pooled training data."""
    net = task.model_fn(torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(net.parameters(), lr=LR)
    x, y = task.train.inputs, task.train.targets
    gen = torch.Generator().manual_seed(1)

    def one_round() -> None:
        for _ in range(m * k):
            idx = torch.randint(0, len(x), (B,), generator=gen)
            opt.zero_grad()
            task.loss_fn(net(x[idx]), y[idx]).mean().backward()
            opt.step()

    return one_round


def fedavg_loop_round(task: Task, m: int, k: int, lt: bool = False) -> Callable[[], None]:
    """Hand-written FedAvg: the round's cohort (the engine's client sampling), each client K
    SGD steps from the global weights on batches of its own data, the local models averaged.
    ``lt``: each client first evaluates its mean loss on all its data at the global weights
    (the engine's ℓ_t), as a hand-written LocalUpdateDecay would."""
    data = task.train
    assert isinstance(data, InMemoryData)
    glob = task.model_fn(torch.Generator().manual_seed(0))
    local = copy.deepcopy(glob)
    opt = torch.optim.SGD(local.parameters(), lr=LR)
    x, y = data.inputs, data.targets
    gen = torch.Generator().manual_seed(1)
    state = {"t": 0}

    def one_round() -> None:
        clients = sample_clients(0, state["t"], data.num_clients, m)
        state["t"] += 1
        total = [torch.zeros_like(p) for p in glob.parameters()]
        losses: list[torch.Tensor] = []
        for c in clients.tolist():
            with torch.no_grad():
                for p, g in zip(local.parameters(), glob.parameters(), strict=True):
                    p.copy_(g)
            off, n = int(data.offsets[c]), int(data.counts[c])
            if lt:
                with torch.no_grad():
                    losses.append(task.loss_fn(local(x[off : off + n]), y[off : off + n]).mean())
            rows = torch.randint(0, n, (k, B), generator=gen) + off
            for step in range(k):
                opt.zero_grad()
                task.loss_fn(local(x[rows[step]]), y[rows[step]]).mean().backward()
                opt.step()
            with torch.no_grad():
                torch._foreach_add_(total, list(local.parameters()))
        with torch.no_grad():
            for p, s in zip(glob.parameters(), total, strict=True):
                p.copy_(s / len(clients))
        one_round.client_losses = losses  # type: ignore[attr-defined]

    return one_round


# -- timing ---------------------------------------------------------------------------------------
def rounds_for(one_round: Callable[[], None], target: float, device: str = "cpu") -> int:
    """Warm up (two rounds) and pick the number of rounds of one sample (≈ ``target`` s)."""
    one_round()
    sync(device)
    start = time.perf_counter()
    one_round()
    sync(device)
    per = max(time.perf_counter() - start, 1e-6)
    return max(1, min(500, round(target / per)))


def sample(one_round: Callable[[], None], rounds: int, device: str = "cpu") -> float:
    sync(device)
    start = time.perf_counter()
    for _ in range(rounds):
        one_round()
    sync(device)
    return rounds / (time.perf_counter() - start)


def profile_top(one_round: Callable[[], None], rounds: int, top: int = 12) -> dict:
    """cProfile of ``rounds`` rounds: total and the ``top`` functions by own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(rounds):
        one_round()
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in sorted(
        stats.stats.items(),  # type: ignore[attr-defined]
        key=lambda kv: -kv[1][2],
    )[:top]:
        where = name if file == "~" else f"{Path(file).name}:{line}({name})"
        rows.append(
            {
                "function": where,
                "calls": ncalls,
                "own_s": round(tottime, 4),
                "cum_s": round(cumtime, 4),
                "own_share": round(tottime / total, 3) if total else None,
            }
        )
    phases = {}
    for (file, _, name), (_, _, _, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        phase = PHASES.get((Path(file).name, name))
        if phase is not None:
            phases[phase] = round(phases.get(phase, 0.0) + cumtime, 4)
    shares = {k: round(v / total, 3) for k, v in phases.items()} if total else {}
    return {
        "rounds": rounds,
        "total_s": round(total, 4),
        "engine_phases_cum_s": phases,
        "engine_phases_share": shares,
        "top_by_own_time": rows,
    }


#: where an engine round's time goes (cumulative): the ℓ_t forward over the cohort's data, the
#: clients' local steps (the runner), the aggregation and the cohort's batch rows
PHASES = {
    ("evaluation.py", "client_mean_losses"): "lt_eval",
    ("runners.py", "map"): "local_steps",
    ("base.py", "weighted_mean"): "aggregate",
    ("engine.py", "_cohort"): "cohort_rows",
}


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def measure(
    fns: dict, m: int, k: int, params: int, repeats: int, target: float, device: str = "cpu"
) -> dict:
    """Rounds per sample sized to ``target`` s, then ``repeats`` interleaved samples of each fn."""
    rounds = {name: rounds_for(fn, target, device) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(sample(fn, rounds[name], device))
    return {
        "M": m,
        "K": k,
        "B": B,
        "parameters": params,
        "rounds_per_sample": rounds,
        "rounds_per_s": {name: statistics.median(s) for name, s in samples.items()},
        "samples_rounds_per_s": samples,
    }


def run_cell(model: str, m: int, k: int, repeats: int, target: float) -> dict:
    task = digits_task(model)
    task_cfg = {"name": "digits", "clients": CLIENTS, "dirichlet": 0.5, "model": model, "seed": 0}
    makers = {
        "vectorized": lambda: engine_round(task, task_cfg, "vectorized", m, k),
        "sequential": lambda: engine_round(task, task_cfg, "sequential", m, k),
        "plain": lambda: plain_round(task, m, k),
        "fedavg_loop": lambda: fedavg_loop_round(task, m, k),
        "fedavg_loop_lt": lambda: fedavg_loop_round(task, m, k, lt=True),
    }
    load_before = load1()
    rounds_fn = {name: makers[name]() for name in METHODS}
    params = sum(p.numel() for p in task.model_fn(torch.Generator().manual_seed(0)).parameters())
    cell = {"model": model, **measure(rounds_fn, m, k, params, repeats, target)}
    cell["steps_per_s"] = {n: v * m * k for n, v in cell["rounds_per_s"].items()}
    cell["load_average_1min"] = [load_before, load1()]
    score(cell)
    goals = cell["goal_met"]
    profiles = {}
    if not goals["req1_sequential_ge_fedavg_loop"]:
        profiles["sequential"] = profile_top(
            rounds_fn["sequential"], cell["rounds_per_sample"]["sequential"]
        )
    if not goals["req2_met"]:
        profiles["vectorized"] = profile_top(
            rounds_fn["vectorized"], cell["rounds_per_sample"]["vectorized"]
        )
    if profiles:
        cell["profiles"] = profiles
    return cell


def score(cell: dict) -> dict:
    """Ratios, the runner ``auto`` picks (the current rule) and the goals, from the medians."""
    med, m, k = cell["rounds_per_s"], cell["M"], cell["K"]
    auto = choose_runner("auto", cell["parameters"], torch.device("cpu"), m, k)
    ratios = {
        "vectorized_vs_plain": med["vectorized"] / med["plain"],
        "sequential_vs_plain": med["sequential"] / med["plain"],
        "sequential_vs_fedavg_loop": med["sequential"] / med["fedavg_loop"],
        "vectorized_vs_sequential": med["vectorized"] / med["sequential"],
        "auto_vs_plain": med[auto] / med["plain"],
    }
    if "fedavg_loop_lt" in med:  # cells measured before that baseline existed lack it
        ratios["sequential_vs_fedavg_loop_lt"] = med["sequential"] / med["fedavg_loop_lt"]
    goals = {
        "req1_sequential_ge_fedavg_loop": ratios["sequential_vs_fedavg_loop"] >= 1.0,
        "req2_vectorized_ge_plain": ratios["vectorized_vs_plain"] >= 1.0,
        "req2_auto_ge_plain": ratios["auto_vs_plain"] >= 1.0,
    }
    goals["req2_met"] = goals["req2_vectorized_ge_plain"] or goals["req2_auto_ge_plain"]
    if "sequential_vs_fedavg_loop_lt" in ratios:  # reported, not the goal: the same work
        goals["same_work_sequential_ge_fedavg_loop_lt"] = (
            ratios["sequential_vs_fedavg_loop_lt"] >= 1.0
        )
    cell.update(
        {
            "ratios": {n: round(v, 3) for n, v in ratios.items()},
            "auto_picks": auto,
            "goal_met": goals,
        }
    )
    return cell


def cell_key(model: str, m: int, k: int) -> str:
    return f"{model}/{m}/{k}"


def summarize(cells: dict) -> dict:
    values = list(cells.values())

    def worst(ratio: str) -> dict:
        c = min(values, key=lambda c: c["ratios"][ratio])
        return {"cell": cell_key(c["model"], c["M"], c["K"]), "ratio": c["ratios"][ratio]}

    return {
        "cells": len(values),
        "req1_met": sum(c["goal_met"]["req1_sequential_ge_fedavg_loop"] for c in values),
        "req2_vectorized_met": sum(c["goal_met"]["req2_vectorized_ge_plain"] for c in values),
        "req2_met_with_auto": sum(c["goal_met"]["req2_met"] for c in values),
        "worst_sequential_vs_fedavg_loop": worst("sequential_vs_fedavg_loop"),
        "worst_vectorized_vs_plain": worst("vectorized_vs_plain"),
        "worst_auto_vs_plain": worst("auto_vs_plain"),
        "unmet_req1": [
            k for k, c in cells.items() if not c["goal_met"]["req1_sequential_ge_fedavg_loop"]
        ],
        "unmet_req2": [k for k, c in cells.items() if not c["goal_met"]["req2_met"]],
        # the same work as the engine (ℓ_t included): cells measured with that baseline only
        "same_work_measured": sum("fedavg_loop_lt" in c["rounds_per_s"] for c in values),
        "same_work_met": sum(
            c["goal_met"].get("same_work_sequential_ge_fedavg_loop_lt", False) for c in values
        ),
        "unmet_same_work": [
            k
            for k, c in cells.items()
            if c["goal_met"].get("same_work_sequential_ge_fedavg_loop_lt") is False
        ],
    }


def selected(patterns: str | None) -> list[tuple[str, int, int]]:
    grid = [(mo, m, k) for mo in MODELS for m in MS for k in KS]
    if not patterns:
        return grid
    pats = [p.strip() for p in patterns.split(",") if p.strip()]
    return [c for c in grid if any(fnmatch.fnmatch(cell_key(*c), p) for p in pats)]


# -- CUDA mode ------------------------------------------------------------------------------------
def image_task(n_clients: int = 100, per_client: int = 40, seed: int = 0) -> Task:
    """Synthetic 32×32×3 images, 10 classes, ``per_client`` examples per client, ResNet-18."""
    from fedtune.trainers.models import build_model

    gen = torch.Generator().manual_seed(seed)
    n = n_clients * per_client
    data = InMemoryData(
        inputs=torch.randn(n, 3, 32, 32, generator=gen),
        targets=torch.randint(0, 10, (n,), generator=gen),
        offsets=torch.arange(n_clients) * per_client,
        counts=torch.full((n_clients,), per_client),
        client_ids=[str(i) for i in range(n_clients)],
    )
    return Task(
        name="images",
        train=data,
        model_fn=lambda g: build_model("resnet18_gn", (3, 32, 32), 10, g),
        loss_fn=cross_entropy,
        test=Dataset(data.inputs[:64], data.targets[:64]),
        metric_fns={"accuracy": accuracy},
    )


def run_device(device: str, m: int, k: int, repeats: int, target: float, models) -> dict:
    """Vectorized vs sequential on ``device`` (the digits CNN and ResNet-18)."""
    out = {}
    for label in models:
        if label == "resnet18_gn":
            task = image_task()
            task_cfg = {"name": "images"}
        else:
            task = digits_task(label)
            task_cfg = {"name": "digits", "clients": CLIENTS, "model": label, "seed": 0}
        fns = {
            r: engine_round(task, task_cfg, r, m, k, device) for r in ("vectorized", "sequential")
        }
        params = sum(p.numel() for p in fns["vectorized"].trainer.model.parameters())
        cell = measure(fns, m, k, params, repeats, target, device)
        med = cell["rounds_per_s"]
        out[label] = {
            **cell,
            "vectorized_vs_sequential": med["vectorized"] / med["sequential"],
            "auto_picks": choose_runner("auto", params, torch.device(device), m, k),
            "runner_used": {r: fn.trainer.result().runner for r, fn in fns.items()},
        }
    return out


def device_name(device: str) -> str | None:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return None


# -- README table ---------------------------------------------------------------------------------
def markdown(doc: dict) -> str:
    lines = [
        "| model | M | K | vectorized | sequential | plain loop | FedAvg loop | vec/plain | seq/FedAvg loop | seq/FedAvg loop + ℓ_t | auto | goals |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in [cell_key(*c) for c in selected(None)]:
        c = doc["cells"].get(key)
        if c is None:
            continue
        r, q, g = c["rounds_per_s"], c["ratios"], c["goal_met"]
        marks = (
            ("1✓" if g["req1_sequential_ge_fedavg_loop"] else "1✗")
            + " "
            + (("2✓" if g["req2_vectorized_ge_plain"] else "2✓(auto)") if g["req2_met"] else "2✗")
        )
        lt = q.get("sequential_vs_fedavg_loop_lt")
        same = "–" if lt is None else f"{lt:.2f}"
        lines.append(
            f"| {c['model']} | {c['M']} | {c['K']} | {r['vectorized']:.1f} | {r['sequential']:.1f}"
            f" | {r['plain']:.1f} | {r['fedavg_loop']:.1f} | {q['vectorized_vs_plain']:.2f}"
            f" | {q['sequential_vs_fedavg_loop']:.2f} | {same} | {c['auto_picks']} | {marks} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.4, help="seconds per timed sample")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--device", default="cpu", help="cpu (the grid) or cuda[:N]")
    parser.add_argument("--update", default=None, help="re-run only these cells (model/M/K globs)")
    parser.add_argument("--markdown", action="store_true", help="print the README table and exit")
    parser.add_argument(
        "--large",
        action="store_true",
        help="only: ResNet-18-GN (11 M parameters) on the CPU, vectorized vs sequential at M=10, "
        "K=1 (the evidence for auto's parameter threshold), merged into the JSON",
    )
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="recompute ratios, auto's picks and goals from the stored medians (no timing)",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    cuda = args.device.startswith("cuda")
    default = "engine_throughput_cuda.json" if cuda else "engine_throughput.json"
    out_path = Path(args.out) if args.out else RESULTS / default
    if args.markdown:
        doc = json.loads(out_path.read_text())
        print(markdown(doc))
        return doc
    if args.large:
        doc = json.loads(out_path.read_text())
        doc["large_model_cpu"] = {
            "load_average_1min_before": load1(),
            **run_device("cpu", 10, 1, args.repeats, args.target, ("resnet18_gn",)),
            "load_average_1min_after": load1(),
        }
        out_path.write_text(json.dumps(doc, indent=2))
        print(json.dumps(doc["large_model_cpu"], indent=2))
        return doc
    if args.rescore:
        doc = json.loads(out_path.read_text())
        for cell in doc["cells"].values():
            score(cell)
        doc["summary"] = summarize(doc["cells"])
        out_path.write_text(json.dumps(doc, indent=2))
        print(json.dumps(doc["summary"], indent=2))
        return doc
    torch.set_num_threads(args.threads)
    if cuda:
        if not torch.cuda.is_available():
            raise SystemExit(f"--device {args.device}: no CUDA device here")
        doc = {
            "benchmark": "engine_throughput_cuda",
            "device": args.device,
            "device_name": device_name(args.device),
            "setting": {"repeats": args.repeats, "target_s": args.target},
            "environment": environment(),
            "results": run_device(
                args.device, 50, 10, args.repeats, args.target, ("cnn", "resnet18_gn")
            ),
        }
        out_path.write_text(json.dumps(doc, indent=2))
        print(json.dumps(doc["results"], indent=2))
        return doc
    doc = {"cells": {}}
    if args.update and out_path.exists():
        doc = json.loads(out_path.read_text())
    cells = selected(args.update)
    started = time.perf_counter()
    for model, m, k in cells:
        cell = run_cell(model, m, k, args.repeats, args.target)
        doc["cells"][cell_key(model, m, k)] = cell
        write(doc, args, cells, started, out_path)  # a cut-off run keeps the cells it measured
        r, q = cell["rounds_per_s"], cell["ratios"]
        print(
            f"{model:6s} M={m:3d} K={k:2d}  vec {r['vectorized']:8.2f}  seq {r['sequential']:8.2f}"
            f"  plain {r['plain']:8.2f}  loop {r['fedavg_loop']:8.2f}  vec/plain"
            f" {q['vectorized_vs_plain']:5.2f}  seq/loop {q['sequential_vs_fedavg_loop']:5.2f}"
            f"  auto={cell['auto_picks']}  load {cell['load_average_1min']}",
            flush=True,
        )
    write(doc, args, cells, started, out_path)
    print(json.dumps(doc["summary"], indent=2))
    print(f"wrote {out_path}")
    return doc


def write(doc: dict, args, cells, started: float, out_path: Path) -> None:
    """Settings, environment, summary and the cells so far, to ``out_path``."""
    doc.update(
        {
            "benchmark": "engine_throughput",
            "setting": {
                "task": f"digits ({CLIENTS} clients, Dirichlet 0.5)",
                "algorithm": "fedavg",
                "B": B,
                "models": list(MODELS),
                "M": list(MS),
                "K": list(KS),
                "repeats": args.repeats,
                "target_s_per_sample": args.target,
                "threads": args.threads,
                "units": "rounds/s (median over repeats); a round is M·K steps of batch B",
                "engine_round_includes": "ℓ_t (cohort loss before training); no population eval",
            },
            "environment": environment(),
            "last_run_s": round(time.perf_counter() - started, 1),
            "last_run_cells": [cell_key(*c) for c in cells],
        }
    )
    doc["summary"] = summarize(doc["cells"])
    doc["cells"] = dict(sorted(doc["cells"].items(), key=lambda kv: _order(kv[0])))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(doc, indent=2))


def _order(key: str) -> tuple[int, int, int]:
    model, m, k = key.split("/")
    return (MODELS.index(model), int(m), int(k))


if __name__ == "__main__":
    main()
