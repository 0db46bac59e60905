"""Packed trials against one process per trial: configuration-rounds per second and memory.

For each task — the digits ``mlp`` and the ``quadratic`` — and P ∈ {1, 8, 64} configurations
(FedAvgM with different γ, η, β and trial seeds; M = 10 clients per round, K = 10 local steps,
B = 20; population evaluation off, as in ``engine_throughput.py``):

* ``packed`` — one fresh process runs a :class:`fedtune.trainers.packed.PackedTrainer` of the
  P configurations; after two warm-up rounds it times rounds for about ``--target`` seconds
  per sample. Configuration-rounds/s = P · rounds / seconds; the process's resident set
  (``VmRSS``, and the peak ``VmHWM``) is read from ``/proc/self/status`` after the samples,
  and divided by P for the memory per configuration; ``minor_faults_per_round`` counts the
  pages the process faulted in during the samples (``getrusage``), per round. The pack's torch
  threads are every core by default (``--pack-threads``), since the separate processes share
  every core too; run it on a quiet machine (under other load a 2-thread pool on 2 cores ran
  2–4× slower).
* ``separate`` — the first 8 of the same configurations as 8 processes started together, each
  an unpacked :class:`fedtune.trainers.Trainer` (one torch thread each: 8 trials on this
  machine's cores, as Ray would place them). Each warms up two rounds, waits at a barrier, then
  counts the rounds it completes in ``--target`` seconds per sample; configuration-rounds/s is
  the sum over the processes, the memory is the sum of their resident sets.

For the MLP on a CPU the JSON also gives the arithmetic ``ceiling``: the training FLOPs of one
configuration-round, the fp32 rate of the batched products a pack of 64 runs (``torch.bmm`` on
the MLP's layer shapes, every core), the configuration-rounds/s that rate would allow and the
speedup over the separate processes it bounds.

``--chunk N`` runs a pack's clients N members per vmapped call instead of the pack's own choice
(``CPU_CHUNK_BYTES`` on a CPU). Medians over ``--repeats`` samples. Goals (issue "packed
trials"): 64 configurations in ≤ 2 GB of resident memory in all, and packed P = 64 ≥ 10× the
configuration-rounds/s of the 8 separate processes. Writes ``benchmarks/results/packing.json``
(``packing_cuda.json`` with ``--device cuda``: both sides on the GPU, run on a lent GPU machine
by ``benchmarks/cuda_checks.sh``).

Usage::

    python benchmarks/packing.py [--repeats 3] [--target 2.0] [--tasks mlp,quadratic]
    python benchmarks/packing.py --device cuda
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment, memory_mib, sync

RESULTS = Path(__file__).parent / "results"
PACK_SIZES = (1, 8, 64)
SEPARATE = 8
M, K, B = 10, 10, 20
TASKS = {
    "mlp": {"name": "digits", "seed": 0, "clients": 100, "dirichlet": 0.5, "model": "mlp"},
    "quadratic": {"name": "quadratic", "seed": 0, "clients": 100, "dim": 20, "examples": 40},
}
#: rates are scaled per task so that no configuration diverges (a diverged member would leave
#: the pack and the benchmark would time fewer than P configurations)
RATE_SCALE = {"mlp": 1.0, "quadratic": 0.05}
GOAL_MEMORY_GB = 2.0
GOAL_SPEEDUP = 10.0


def configs(task: str, p: int, device: str) -> list[dict]:
    """P FedAvgM configurations of ``task`` differing in γ, η, β and the trial seed."""
    out = []
    for j in range(p):
        out.append(
            {
                "task": TASKS[task],
                "algorithm": "fedavgm",
                "train": {
                    "rounds": 10**6,
                    "clients_per_round": M,
                    "local_steps": K,
                    "batch_size": B,
                    "eval_every": 10**6,
                    "eval_population": "off",
                    "device": device,
                },
                "hparams": {
                    "client_lr": RATE_SCALE[task] * (0.02 + 0.01 * (j % 8)),
                    "server_lr": RATE_SCALE[task] * (0.02 + 0.01 * (j % 5)),
                    "server_momentum": 0.3 + 0.05 * (j % 9),
                },
                "seed": j,
            }
        )
    return out


def rss_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MiB."""
    fields = memory_mib()
    return fields["VmRSS"], fields["VmHWM"]


def graph_fields(pack) -> dict[str, Any]:
    """How many CUDA graphs a pack recorded of its local steps, and why none (if it failed)."""
    graphs = pack.step_graphs
    return {
        "graphs_recorded": 0 if graphs is None else graphs.recorded,
        "graphs_failed": None if graphs is None else graphs.failed,
    }


def time_rounds(pack, device: str, rounds: int) -> float:
    """Seconds that ``rounds`` rounds of a pack take, its device synchronised before and after.

    Args:
        pack: A :class:`fedtune.trainers.packed.PackedTrainer`.
        device: Its device.
        rounds: Rounds to time.

    Returns:
        The seconds.
    """
    sync(device)
    start = time.perf_counter()
    for _ in range(rounds):
        pack.step()
    sync(device)
    return time.perf_counter() - start


# -- child processes ---------------------------------------------------------------------------
def _reporting(fn):
    """Run a child's body; on an error put ``{"error": ...}`` so the parent does not wait."""

    def run(*args):
        queue = args[-1]
        try:
            fn(*args)
        except BaseException as exc:  # report anything, then re-raise in the child
            queue.put({"error": f"{type(exc).__name__}: {exc}"})
            raise

    run.__name__ = fn.__name__
    return run


def packed_child(task, p, device, repeats, target, threads, stagger, chunk, queue):
    """One process: a pack of P configurations; the rates of ``repeats`` timed samples."""
    _reporting(_packed_child)(task, p, device, repeats, target, threads, stagger, chunk, queue)


def _packed_child(task, p, device, repeats, target, threads, stagger, chunk, queue):
    import torch

    torch.set_num_threads(threads)

    import fedtune
    from fedtune.trainers.packed import PackedTrainer

    waves = [configs(task, p, device)[w::stagger] for w in range(stagger)]
    pack = PackedTrainer(waves[0], chunk=chunk)
    for wave in waves[1:]:  # refills one step apart: the members sit at ``stagger`` rounds
        pack.step()
        for cfg in wave:
            pack.add(cfg)
    pack.step()
    per = max(time_rounds(pack, device, 1), 1e-6)
    rounds = max(1, round(target / per))
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rates = [p * rounds / time_rounds(pack, device, rounds) for _ in range(repeats)]
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    rss, peak = rss_mb()
    queue.put(
        {
            "config_rounds_per_s": rates,
            "rounds_per_sample": rounds,
            "rss_mb": rss,
            "peak_rss_mb": peak,
            "minor_faults_per_round": faults / (rounds * repeats),
            "torch_threads": torch.get_num_threads(),
            "round_indices": len({m.round for m in pack._members}),
            "fedtune_path": str(Path(fedtune.__file__).parent),
        }
    )


def separate_child(cfg: dict, repeats: int, target: float, barrier, queue) -> None:
    """One process, one unpacked trial: rounds completed in each ``target``-second sample."""
    _reporting(_separate_child)(cfg, repeats, target, barrier, queue)


def _separate_child(cfg: dict, repeats: int, target: float, barrier, queue) -> None:
    import torch

    torch.set_num_threads(1)
    from fedtune.trainers import Trainer

    trainer = Trainer(cfg)
    trainer.step()
    trainer.step()
    device = cfg["train"]["device"]
    rates = []
    for _ in range(repeats):
        barrier.wait()
        sync(device)
        start = time.perf_counter()
        done = 0
        while time.perf_counter() - start < target:
            trainer.step()
            done += 1
        sync(device)
        rates.append(done / (time.perf_counter() - start))
    rss, peak = rss_mb()
    queue.put({"rounds_per_s": rates, "rss_mb": rss, "peak_rss_mb": peak})


# -- the arithmetic ceiling ----------------------------------------------------------------------
def mlp_flops_per_config_round() -> int:
    """Training FLOPs of one MLP configuration-round: 6 FLOPs per weight and example (forward,
    gradient of the input, gradient of the weight) over the M·K·B examples of its local steps
    (the round's ℓ_t pass over the cohort's data is left out: a lower bound)."""
    from fedtune.trainers.models.basic import mlp

    layers = [m for m in mlp((64,), 10).modules() if hasattr(m, "in_features")]
    weights = sum(m.in_features * m.out_features for m in layers)
    return 6 * weights * M * K * B


def bmm_gflops(threads: int, p: int = 64, seconds: float = 1.0) -> float:
    """The best fp32 rate of the batched products a pack of P MLP configurations runs: each
    layer's forward ``[P·M, B, in] @ [P·M, in, out]``, timed for ``seconds`` with ``threads``
    torch threads (the median over the MLP's three layers, weighted by their FLOPs)."""
    import torch

    torch.set_num_threads(threads)
    total_flops = total_s = 0.0
    for fan_in, fan_out in ((64, 128), (128, 128), (128, 10)):
        a = torch.randn(p * M, B, fan_in)
        w = torch.randn(p * M, fan_in, fan_out)
        for _ in range(3):
            torch.bmm(a, w)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            torch.bmm(a, w)
            done += 1
        total_s += time.perf_counter() - start
        total_flops += done * 2.0 * p * M * B * fan_in * fan_out
    return total_flops / total_s / 1e9


def ceiling(separate_rate: float) -> dict:
    """The MLP's configuration-rounds/s if a pack ran at the measured rate of its batched
    products with every core, and the speedup over the separate processes that allows."""
    import torch

    threads = os.cpu_count() or 1
    flops = mlp_flops_per_config_round()
    rate = bmm_gflops(threads)
    best = rate * 1e9 / flops
    return {
        "flops_per_config_round": flops,
        "bmm_gflops": round(rate, 1),
        "bmm_threads": threads,
        "config_rounds_per_s_at_bmm_rate": round(best, 1),
        "max_speedup_vs_separate": round(best / separate_rate, 2),
        "separate_gflops": round(separate_rate * flops / 1e9, 2),
        "torch": torch.__version__,
    }


# -- the parent ----------------------------------------------------------------------------------
def _checked(out: dict) -> dict:
    if "error" in out:
        raise RuntimeError(f"benchmark child failed: {out['error']}")
    return out


def run_packed(
    task: str,
    p: int,
    device: str,
    repeats: int,
    target: float,
    threads: int,
    stagger: int = 1,
    chunk: int | None = None,
) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    args = (task, p, device, repeats, target, threads, stagger, chunk, queue)
    proc = ctx.Process(target=packed_child, args=args)
    proc.start()
    out = _checked(queue.get())
    proc.join()
    median = statistics.median(out["config_rounds_per_s"])
    return {
        "P": p,
        "config_rounds_per_s": median,
        "samples": out["config_rounds_per_s"],
        "rounds_per_sample": out["rounds_per_sample"],
        "rss_mb": round(out["rss_mb"], 1),
        "peak_rss_mb": round(out["peak_rss_mb"], 1),
        "rss_mb_per_config": round(out["rss_mb"] / p, 2),
        "minor_faults_per_round": round(out["minor_faults_per_round"], 1),
        "torch_threads": out["torch_threads"],
        "round_indices": out["round_indices"],
        "fedtune_path": out["fedtune_path"],
    }


def _packed_row(args: argparse.Namespace, task: str, p: int, stagger: int = 1) -> dict:
    """:func:`run_packed` with the command line's device, repeats, target, threads and chunk."""
    return run_packed(
        task, p, args.device, args.repeats, args.target, args.pack_threads, stagger, args.chunk
    )


def run_separate(task: str, device: str, repeats: int, target: float) -> dict:
    ctx = mp.get_context("spawn")
    queue, barrier = ctx.Queue(), ctx.Barrier(SEPARATE)
    procs = [
        ctx.Process(target=separate_child, args=(cfg, repeats, target, barrier, queue))
        for cfg in configs(task, SEPARATE, device)
    ]
    for proc in procs:
        proc.start()
    outs = []
    for _ in procs:
        out = queue.get()
        if "error" in out:
            for proc in procs:
                proc.terminate()
        outs.append(_checked(out))
    for proc in procs:
        proc.join()
    totals = [sum(o["rounds_per_s"][r] for o in outs) for r in range(repeats)]
    rss = sum(o["rss_mb"] for o in outs)
    return {
        "processes": SEPARATE,
        "config_rounds_per_s": statistics.median(totals),
        "samples": totals,
        "rss_mb_total": round(rss, 1),
        "peak_rss_mb_total": round(sum(o["peak_rss_mb"] for o in outs), 1),
        "rss_mb_per_config": round(rss / SEPARATE, 1),
        "torch_threads_each": 1,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", type=float, default=2.0, help="seconds per timed sample")
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--sizes", default=",".join(map(str, PACK_SIZES)))
    parser.add_argument("--device", default="cpu", help="cpu or cuda (cuda: not run here)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--chunk",
        type=int,
        default=None,
        help="members per vmapped client call (default: the pack's own, CPU_CHUNK_BYTES)",
    )
    parser.add_argument(
        "--pack-threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads of the packed process (default: every core, as the separate "
        "processes use every core; run on a quiet machine: under other load a 2-thread pool "
        "on 2 cores ran 2-4x slower)",
    )
    parser.add_argument(
        "--stagger",
        type=int,
        default=1,
        help="S > 1: time each pack with its members at one round index and at S (joined one "
        "step apart, as refills join), no separate processes; writes packing_staggered.json",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.stagger > 1:
        return staggered(args, sizes, sys.argv[1:] if argv is None else argv)
    results = {}
    for task in args.tasks.split(","):
        load_before = os.getloadavg()[0]
        separate = run_separate(task, args.device, args.repeats, args.target)
        packed = [_packed_row(args, task, p) for p in sizes]
        largest = packed[-1]
        results[task] = {
            "separate": separate,
            "packed": packed,
            "speedup_vs_separate": {
                str(r["P"]): round(r["config_rounds_per_s"] / separate["config_rounds_per_s"], 2)
                for r in packed
            },
            "goals": {
                f"P={largest['P']} rss <= {GOAL_MEMORY_GB} GB": largest["rss_mb"]
                <= GOAL_MEMORY_GB * 1024,
                f"P={largest['P']} >= {GOAL_SPEEDUP}x separate": largest["config_rounds_per_s"]
                >= GOAL_SPEEDUP * separate["config_rounds_per_s"],
            },
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        }
        if task == "mlp" and args.device == "cpu":
            results[task]["ceiling"] = ceiling(separate["config_rounds_per_s"])
        print(json.dumps({task: results[task]}, indent=2), flush=True)
    doc = {
        "benchmark": "packing",
        "setting": {
            **_setting(args, sizes),
            "tasks": {t: TASKS[t] for t in args.tasks.split(",")},
            "separate_processes": SEPARATE,
            "separate_threads_each": 1,
        },
        "environment": environment(),
        "results": results,
    }
    name = "packing.json" if args.device == "cpu" else "packing_cuda.json"
    out = args.out or RESULTS / name
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _setting(args: argparse.Namespace, sizes: list[int]) -> dict[str, Any]:
    """What every packing JSON says of its setting."""
    return {
        "algorithm": "fedavgm",
        "clients_per_round": M,
        "local_steps": K,
        "batch_size": B,
        "pack_sizes": sizes,
        "repeats": args.repeats,
        "target_s": args.target,
        "device": args.device,
        "pack_threads": args.pack_threads,
        "chunk": args.chunk,
        "statistic": "median over repeats",
    }


def staggered(args: argparse.Namespace, sizes: list[int], argv: list[str]) -> dict:
    """Packs whose members sit at one round index against packs whose members sit at
    ``--stagger`` (the cost of refills: one cohort per round index); writes the JSON."""
    results: dict[str, Any] = {}
    for task in args.tasks.split(","):
        rows = []
        for p in sizes:
            one, spread = (_packed_row(args, task, p, s) for s in (1, min(args.stagger, p)))
            rows.append(
                {
                    "P": p,
                    "one_round_index": one,
                    "staggered": spread,
                    "ratio": round(spread["config_rounds_per_s"] / one["config_rounds_per_s"], 3),
                }
            )
            print(task, p, rows[-1]["ratio"], flush=True)
        results[task] = rows
    doc = {
        "benchmark": "packing_staggered",
        "setting": {**_setting(args, sizes), "stagger": args.stagger},
        "environment": environment(),
        "command": "python benchmarks/packing.py " + " ".join(argv),
        "results": results,
    }
    out = args.out or RESULTS / "packing_staggered.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


if __name__ == "__main__":
    main()
