"""One client's local update, step for step: the engine's client function vs a hand-written loop.

The sequential runner is meant to keep up with a hand-written FedAvg loop. This
isolates the part of a round both do — K SGD steps of one client on batches of B rows — from
what only the engine does per round (ℓ_t, stacking and averaging messages, batch rows):

* ``loop`` — ``nn.Module`` + ``torch.optim.SGD``: ``zero_grad``, ``backward``, ``step``;
* ``eager`` — FedAvg's client function as the sequential runner calls it (``fn.eager``:
  :class:`fedtune.trainers.module_loss.ModuleLoss` slot-swap forward + ``torch.autograd.grad``);
* ``functional`` — the same client function under ``torch.func`` (what the sequential runner
  ran before the eager path, and what the vectorized runner vmaps).

Same model weights, rows and learning rate for all three; microseconds per step, medians of
``--repeats`` interleaved samples. Writes ``benchmarks/results/local_step.json``. Usage:
``python benchmarks/local_step.py [--steps 400] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

from fedtune.trainers import build_task
from fedtune.trainers.client import ClientRule, make_client_fn
from fedtune.trainers.module_loss import ModuleLoss

B, LR, K = 20, 0.05, 10
OUT = Path(__file__).parent / "results" / "local_step.json"


def step_fns(model: str, steps: int) -> dict[str, Callable[[], None]]:
    """``steps`` local steps of each kind, as K-step client updates (``steps`` a multiple of K)."""
    task = build_task("digits", {"clients": 100, "dirichlet": 0.5, "model": model}, seed=0)
    net = task.model_fn(torch.Generator().manual_seed(0))
    x, y = task.train.inputs, task.train.targets
    rows = torch.randint(0, len(x), (steps // K, K, B), generator=torch.Generator().manual_seed(1))
    xb, yb = x[rows], y[rows]  # [updates, K, B, ...]

    local = copy.deepcopy(net)
    opt = torch.optim.SGD(local.parameters(), lr=LR)

    def loop() -> None:
        for u in range(rows.shape[0]):
            for k in range(K):
                opt.zero_grad()
                task.loss_fn(local(xb[u, k]), yb[u, k]).mean().backward()
                opt.step()

    fn = make_client_fn(
        ModuleLoss(copy.deepcopy(net), task.loss_fn), ClientRule(theta=torch.ones(K))
    )
    params = {n: p.detach().clone() for n, p in net.named_parameters()}

    def client(run: Callable) -> Callable[[], None]:
        def update() -> None:
            for u in range(rows.shape[0]):
                run(params, LR, xb[u], yb[u])

        return update

    return {"loop": loop, "eager": client(fn.eager), "functional": client(fn)}


def measure(model: str, steps: int, repeats: int) -> dict:
    fns = step_fns(model, steps)
    for f in fns.values():
        f()  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, f in fns.items():
            start = time.perf_counter()
            f()
            samples[name].append((time.perf_counter() - start) / steps * 1e6)
    med = {name: statistics.median(s) for name, s in samples.items()}
    return {
        "us_per_step": med,
        "samples_us_per_step": samples,
        "eager_vs_loop_speed": med["loop"] / med["eager"],
        "functional_vs_loop_speed": med["loop"] / med["functional"],
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=400, help="a multiple of K=10")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--models", nargs="+", default=["linear", "mlp", "cnn"])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    steps = max(K, args.steps // K * K)
    results = {}
    for model in args.models:
        results[model] = measure(model, steps, args.repeats)
        r = results[model]["us_per_step"]
        print(f"{model:6s} " + "  ".join(f"{n} {v:8.1f} us" for n, v in r.items()), flush=True)
    doc = {
        "benchmark": "local_step",
        "setting": {
            "B": B,
            "K": K,
            "steps": steps,
            "repeats": args.repeats,
            "threads": 1,
            "task": "digits (100 clients)",
            "units": "microseconds per local step",
        },
        "environment": environment(),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return doc


if __name__ == "__main__":
    main()
