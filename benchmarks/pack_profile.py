"""Where a packed trial's round goes: the host's phases, the device's busy time, kernel launches.

For each task of ``benchmarks/packing.py`` (the digits ``mlp`` and the ``quadratic``; the same
FedAvgM configurations, M = 10, K = 10, B = 20) and each P of ``--sizes``, one
:class:`fedtune.trainers.packed.PackedTrainer` of P configurations warms up 3 rounds, then:

* ``ms_per_round`` — the median of ``--repeats`` timings of ``--rounds`` rounds each (the
  device synchronised before and after);
* ``torch.profiler`` over ``--profiled`` rounds: per round, the device's time in kernels and
  copies (``device_busy_ms``; CUDA only), the kernel launches, the host-device
  synchronisations (``cudaStreamSynchronize``/``cudaDeviceSynchronize``), the host-to-device
  copies and the CUDA graph replays (``graph_launches``; ``graphs_recorded`` is how many graphs
  the pack captured, ``graphs_failed`` why it captured none);
* ``cProfile`` over ``--profiled`` rounds: the share of ``PackedTrainer.step`` spent in each
  phase — ``_open`` (the cohort, the broadcast, ℓ_t and its divergence test, the batch rows
  of members without rows drawn ahead), ``_local_steps``, ``_ahead`` (the next round's batch
  rows, drawn while the local steps are queued on a GPU: ``BatchRows.ahead``) and ``_close``
  (aggregation, the server step, evaluation and records); ``_batches`` is the drawing of batch
  rows (``pack_batches.draw_rows``) wherever it ran, in ``_open`` or ``_ahead``. cProfile slows
  Python, so these are shares, not times.

``batches_ms`` is the wall time per round of drawing every member's batch rows
(``pack_batches.draw_rows``, timed around each call over ``--profiled`` rounds, no profiler);
``rows_drawn_ahead`` is the share of the members' rows over those rounds that had been drawn
a round ahead. On a CPU, ``operators`` times every ATen operator of ``--profiled`` rounds (a
``TorchDispatchMode`` around each call; a CPU operator has finished when it returns): per round,
the milliseconds in the batched products (``bmm``, with the FLOP/s they reach) and in the rest,
and the operators that took longest. The mode's own Python cost is outside those times.

On a GPU, ``device_busy_ms`` far below ``ms_per_round`` means the host bounds the pack.
Writes ``benchmarks/results/pack_profile.json`` (``pack_profile_cuda.json`` with
``--device cuda``).

Usage::

    python benchmarks/pack_profile.py [--sizes 1,64] [--device cuda]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment, sync
from packing import TASKS, B, K, M, configs, graph_fields, time_rounds

RESULTS = Path(__file__).parent / "results"
#: the phases whose cumulative time is reported, as shares of ``PackedTrainer.step``: each
#: phase's function, as the file it is in and its name
PHASES = {
    "_open": ("packed.py", "_open"),
    "_batches": ("pack_batches.py", "draw_rows"),
    "_local_steps": ("packed.py", "_local_steps"),
    "_ahead": ("pack_batches.py", "ahead"),
    "_close": ("packed.py", "_close"),
}
_SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize")
_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
_GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")


def _counters(pack, device: str, rounds: int) -> dict:
    """Per-round device time, launches, synchronisations and host-to-device copies."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(rounds):
            pack.step()
        sync(device)
    events = prof.key_averages()

    def per_round(keys) -> float:
        return sum(e.count for e in events if e.key in keys) / rounds

    out = {
        "kernel_launches": per_round(_LAUNCHES),
        "graph_launches": per_round(_GRAPH_LAUNCHES),
        "synchronisations": per_round(_SYNCS),
        "host_to_device_copies": sum(e.count for e in events if "HtoD" in e.key) / rounds,
    }
    if device.startswith("cuda"):
        busy_us = sum(e.self_device_time_total for e in events)
        out["device_busy_ms"] = busy_us / 1e3 / rounds
    return out


def _operators(pack, rounds: int, top: int = 8) -> dict:
    """Per-round milliseconds of a CPU pack's operators: the batched products and the rest."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    spent: dict[str, float] = {}
    bmm_flops = 0.0

    class Timed(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            nonlocal bmm_flops
            start = time.perf_counter()
            out = func(*args, **(kwargs or {}))
            name = func.overloadpacket.__name__
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - start
            if func is torch.ops.aten.bmm.default:
                (b, m, k), n = args[0].shape, args[1].shape[2]
                bmm_flops += 2.0 * b * m * k * n
            return out

    with Timed():
        for _ in range(rounds):
            pack.step()
    bmm = spent.get("bmm", 0.0)
    return {
        "bmm_ms": round(bmm * 1e3 / rounds, 1),
        "bmm_gflop_per_s": round(bmm_flops / bmm / 1e9, 1) if bmm else None,
        "other_ms": round((sum(spent.values()) - bmm) * 1e3 / rounds, 1),
        "top_ms": {
            k: round(v * 1e3 / rounds, 1)
            for k, v in sorted(spent.items(), key=lambda kv: -kv[1])[:top]
        },
    }


def _batches_ms(pack, rounds: int) -> dict[str, float]:
    """Milliseconds per round in ``draw_rows`` (its module's reference, wrapped), and the share
    of the members' rows that had been drawn ahead."""
    from fedtune.trainers import pack_batches

    draw, spent = pack_batches.draw_rows, []
    taken, reused = pack._rows.taken, pack._rows.reused

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return draw(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - start)

    pack_batches.draw_rows = timed
    try:
        for _ in range(rounds):
            pack.step()
    finally:
        pack_batches.draw_rows = draw
    taken, reused = pack._rows.taken - taken, pack._rows.reused - reused
    return {
        "batches_ms": round(sum(spent) * 1e3 / rounds, 2),
        "rows_drawn_ahead": round(reused / max(taken, 1), 3),
    }


def _phases(pack, device: str, rounds: int) -> dict[str, float]:
    """Each phase's share of ``step`` (cumulative cProfile times)."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(rounds):
        pack.step()
    sync(device)
    profiler.disable()
    where = {"step": ("packed.py", "step"), **PHASES}
    cumulative = {}
    for (path, _, name), row in pstats.Stats(profiler).stats.items():
        for phase, (file, function) in where.items():
            if path.endswith(file) and name == function:
                cumulative[phase] = cumulative.get(phase, 0.0) + row[3]
    total = cumulative.get("step") or 1e-12
    return {name: round(cumulative.get(name, 0.0) / total, 3) for name in PHASES}


def measure(task: str, p: int, device: str, rounds: int, repeats: int, profiled: int) -> dict:
    """One pack's figures (see the module docstring).

    Args:
        task: ``mlp`` or ``quadratic``.
        p: The pack's size.
        device: ``cpu`` or ``cuda``.
        rounds: Rounds per timing.
        repeats: Timings (the median is reported).
        profiled: Rounds under each profiler.

    Returns:
        The pack's figures.
    """
    from fedtune.trainers.packed import PackedTrainer

    pack = PackedTrainer(configs(task, p, device))
    for _ in range(3):
        pack.step()
    samples = [time_rounds(pack, device, rounds) * 1e3 / rounds for _ in range(repeats)]
    operators = {} if device.startswith("cuda") else {"operators": _operators(pack, profiled)}
    return {
        "P": p,
        "ms_per_round": statistics.median(samples),
        **_batches_ms(pack, profiled),
        **operators,
        "samples_ms_per_round": samples,
        **_counters(pack, device, profiled),
        "share_of_step": _phases(pack, device, profiled),
        **graph_fields(pack),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(TASKS))
    parser.add_argument("--sizes", default="1,64")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=20, help="rounds per timing")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profiled", type=int, default=5, help="rounds under each profiler")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {
        task: [
            measure(task, p, args.device, args.rounds, args.repeats, args.profiled) for p in sizes
        ]
        for task in args.tasks.split(",")
    }
    for task, rows in results.items():
        for row in rows:
            busy = row.get("device_busy_ms")
            print(
                f"{task} P={row['P']}: {row['ms_per_round']:.1f} ms/round"
                + ("" if busy is None else f", device busy {busy:.1f} ms")
                + f", {row['kernel_launches']:.0f} launches, batch rows {row['batches_ms']} ms"
                + f", shares {row['share_of_step']}"
                + (f", operators {row['operators']}" if "operators" in row else ""),
                flush=True,
            )
    doc = {
        "benchmark": "pack_profile",
        "setting": {
            "algorithm": "fedavgm",
            "clients_per_round": M,
            "local_steps": K,
            "batch_size": B,
            "tasks": {t: TASKS[t] for t in results},
            "pack_sizes": sizes,
            "rounds_per_timing": args.rounds,
            "repeats": args.repeats,
            "profiled_rounds": args.profiled,
            "device": args.device,
            "torch_threads": args.threads,
            "statistic": "median of the timings; counters per round",
        },
        "command": "python benchmarks/pack_profile.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "results": results,
    }
    name = "pack_profile.json" if args.device == "cpu" else "pack_profile_cuda.json"
    out = args.out or RESULTS / name
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


if __name__ == "__main__":
    main()
