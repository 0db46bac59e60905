"""Memory layouts inside a CPU pack: the batched products' operand layouts and the member sums.

A CPU pack of the digits MLP (``benchmarks/packing.py``'s configurations: M = 10, K = 10,
B = 20) runs its clients in chunks of 16 members, N = 160 (member, client) pairs. Three parts:

* ``products`` — each layer's three batched products at N = 160, in every layout of their
  operands that gives the same result: the forward ``x W^T``, the weight gradient ``d^T x``
  (or its transpose ``x^T d``, what autograd computes for a vmapped linear layer), the input
  gradient ``d W`` (or its transpose). GFLOP/s, the median of ``--repeats`` timings of
  ``--seconds`` each; ``autograd`` names the layout a vmapped ``nn.Linear`` runs today;
* ``member_sums`` — each member's sum over its clients of the 128×128 layer's messages
  ``[160, 128, 128]``, laid out as their gradients come (transposed): the reduction as it is
  (``v.unflatten(0, (16, 10)).sum(1)``) against :func:`fedtune.trainers.pack_clients.member_sums`
  (the same sum read in memory order), milliseconds per call;
* ``pack`` — a pack of ``--pack`` MLP configurations, its rounds timed with each of the two
  sums above (the plain reduction put back for the comparison), interleaved ``--samples``
  times, configuration-rounds/s.

Writes ``benchmarks/results/pack_layouts.json``. ``--threads`` torch threads (default: every
core, as ``packing.py``'s ceiling).

Usage::

    python benchmarks/pack_layouts.py [--pack 64] [--samples 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import write_report
from packing import B, configs, time_rounds

RESULTS = Path(__file__).parent / "results"
#: the MLP's layers (fan-in, fan-out) and the pairs of a chunk of 16 members
LAYERS = ((64, 128), (128, 128), (128, 10))
PAIRS = 160


def gflops(fn: Callable[[], torch.Tensor], flops: float, seconds: float, repeats: int) -> float:
    """The median GFLOP/s of ``repeats`` timings of ``fn`` run for ``seconds`` each."""
    for _ in range(3):
        fn()
    rates = []
    for _ in range(repeats):
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            fn()
            done += 1
        rates.append(done * flops / (time.perf_counter() - start) / 1e9)
    return round(statistics.median(rates), 1)


#: the layout a vmapped ``nn.Linear`` runs today, per product
AUTOGRAD = {
    "forward": "x @ W^T (W^T contiguous)",
    "weight_gradient": "x^T @ d, [in, out]",
    "input_gradient": "d @ W (W^T contiguous)",
}


def layer_ways(x, d, w) -> dict[str, dict[str, Callable[[], torch.Tensor]]]:
    """Each product of a linear layer in each layout; every way returns it oriented alike
    (forward ``[N, B, out]``, weight gradient ``[N, out, in]``, input gradient ``[N, B, in]``;
    a transposed result is a view, not a copy).

    Args:
        x: The layer's inputs ``[N, B, in]``.
        d: The gradient of its outputs ``[N, B, out]``.
        w: Its weights ``[N, out, in]`` (``nn.Linear``'s layout).

    Returns:
        The ways, by product and name.
    """
    w_t = w.mT.contiguous()  # [in, out]: how a pack's state holds it (the gradient's layout)
    return {
        "forward": {
            "x @ W^T (W^T contiguous)": lambda: torch.bmm(x, w_t),
            "x @ W^T (W contiguous)": lambda: torch.bmm(x, w.mT),
            "(W @ x^T)^T": lambda: torch.bmm(w, x.mT).mT,
        },
        "weight_gradient": {
            "x^T @ d, [in, out]": lambda: torch.bmm(x.mT, d).mT,
            "d^T @ x, [out, in]": lambda: torch.bmm(d.mT, x),
        },
        "input_gradient": {
            "d @ W (W^T contiguous)": lambda: torch.bmm(d, w_t.mT),
            "d @ W (W contiguous)": lambda: torch.bmm(d, w),
            "(W^T @ d^T)^T": lambda: torch.bmm(w_t, d.mT).mT,
        },
    }


def products(seconds: float, repeats: int) -> dict:
    """Every layer's products in every layout (see the module docstring)."""
    out = {}
    for fan_in, fan_out in LAYERS:
        gen = torch.Generator().manual_seed(fan_in * fan_out)
        x = torch.randn(PAIRS, B, fan_in, generator=gen)
        d = torch.randn(PAIRS, B, fan_out, generator=gen)
        w = torch.randn(PAIRS, fan_out, fan_in, generator=gen)
        flops = 2.0 * PAIRS * B * fan_in * fan_out
        out[f"{fan_in}x{fan_out}"] = {
            kind: {
                "gflop_per_s": {n: gflops(fn, flops, seconds, repeats) for n, fn in fns.items()},
                "autograd": AUTOGRAD[kind],
            }
            for kind, fns in layer_ways(x, d, w).items()
        }
    return out


def plain_sums(v: torch.Tensor, g: int, m: int) -> torch.Tensor:
    """Each member's sum over its clients as a plain reduction (a contiguous result)."""
    return v.unflatten(0, (g, m)).sum(1)


def member_sums_ms(repeats: int) -> dict:
    """Milliseconds per call of both sums of a transposed ``[160, 128, 128]`` message."""
    from fedtune.trainers.pack_clients import member_sums

    v = torch.randn(PAIRS, 128, 128, generator=torch.Generator().manual_seed(0)).mT
    assert torch.equal(member_sums(v, 16, 10), plain_sums(v, 16, 10)), "the sums differ"
    out = {}
    for name, fn in (("reduction", plain_sums), ("memory_order", member_sums)):
        for _ in range(3):
            fn(v, 16, 10)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(20):
                fn(v, 16, 10)
            times.append((time.perf_counter() - start) * 1e3 / 20)
        out[name] = round(statistics.median(times), 3)
    out["speedup"] = round(out["reduction"] / out["memory_order"], 1)
    return out


def pack_rates(p: int, samples: int, rounds: int) -> dict:
    """Configuration-rounds/s of a pack of ``p`` with either sum, interleaved."""
    from fedtune.trainers import pack_clients
    from fedtune.trainers.packed import PackedTrainer

    sums = {"reduction": plain_sums, "memory_order": pack_clients.member_sums}
    packs = {name: PackedTrainer(configs("mlp", p, "cpu")) for name in sums}
    rates: dict[str, list[float]] = {name: [] for name in sums}
    try:
        for name, pack in packs.items():
            pack_clients.member_sums = sums[name]
            pack.step()
        for _ in range(samples):
            for name, pack in packs.items():
                pack_clients.member_sums = sums[name]
                rates[name].append(round(p * rounds / time_rounds(pack, "cpu", rounds), 1))
    finally:
        pack_clients.member_sums = sums["memory_order"]
    out = {name: {"median": statistics.median(v), "samples": v} for name, v in rates.items()}
    out["ratio_of_medians"] = round(out["memory_order"]["median"] / out["reduction"]["median"], 3)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=0.3, help="per product timing")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pack", type=int, default=64, help="P of the pack comparison")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="rounds per pack sample")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    started = time.time()
    body = {
        "benchmark": "pack_layouts",
        "setting": {"pairs": PAIRS, "B": B, "layers": LAYERS, "dtype": "float32"},
        "products": products(args.seconds, args.repeats),
        "member_sums_ms": member_sums_ms(args.repeats),
        "pack": pack_rates(args.pack, args.samples, args.rounds),
    }
    for layer, kinds in body["products"].items():
        shown = "; ".join(
            f"{kind} " + ", ".join(f"{n} {r}" for n, r in row["gflop_per_s"].items())
            for kind, row in kinds.items()
        )
        print(f"{layer}: {shown} GFLOP/s")
    print("member sums (ms per call):", body["member_sums_ms"])
    print("pack (configuration-rounds/s):", body["pack"])
    out = args.out or RESULTS / "pack_layouts.json"
    used = sys.argv[1:] if argv is None else argv
    write_report(out, body, started, "benchmarks/pack_layouts.py", used)
    return json.loads(out.read_text())


if __name__ == "__main__":
    main()
