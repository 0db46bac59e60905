"""Throughput of one FedAvg round (M=10, K=10, B=20) on the engine's runners vs plain PyTorch.

For each model (softmax/logistic regression and the small CNN on the digits task) it measures
rounds/s and examples/s of:

* ``vectorized`` — the engine with the torch.func vmap runner,
* ``sequential`` — the engine with the reference per-client loop,
* ``centralized`` — a plain PyTorch loop (nn.Module + torch.optim.SGD) doing the same number of
  mini-batch steps (M·K steps of batch B) on pooled data: the practical limit on this machine.

A round of the engine also evaluates ℓ_t (each sampled client's loss on all its data before
training) — part of every round of the papers' protocol; population evaluation is disabled.
Writes ``benchmarks/results/engine_throughput.json`` with medians over repeats, versions and the
machine. Usage: ``python benchmarks/engine_throughput.py [--repeats 5] [--rounds 20]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

from fedtune.trainers import Trainer, build_task

M, K, B = 10, 10, 20


def config(model: str, runner: str, rounds: int) -> dict:
    return {
        "task": {"name": "digits", "clients": 50, "dirichlet": 0.5, "model": model, "seed": 0},
        "algorithm": "fedavg",
        "train": {
            "rounds": rounds + 2,
            "clients_per_round": M,
            "local_steps": K,
            "batch_size": B,
            "eval_every": 10**6,
            "runner": runner,
        },
        "hparams": {"client_lr": 0.05, "server_lr": 0.05},
    }


def time_engine(model: str, runner: str, rounds: int) -> float:
    trainer = Trainer(config(model, runner, rounds))
    trainer.step()
    trainer.step()  # warm-up
    start = time.perf_counter()
    for _ in range(rounds):
        trainer.step()
    return rounds / (time.perf_counter() - start)


def time_centralized(model: str, rounds: int) -> float:
    task = build_task("digits", {"clients": 50, "dirichlet": 0.5, "model": model}, seed=0)
    net = task.model_fn(torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    x, y = task.train.inputs, task.train.targets
    gen = torch.Generator().manual_seed(1)

    def one_round():
        for _ in range(M * K):
            idx = torch.randint(0, len(x), (B,), generator=gen)
            opt.zero_grad()
            task.loss_fn(net(x[idx]), y[idx]).mean().backward()
            opt.step()

    one_round()
    start = time.perf_counter()
    for _ in range(rounds):
        one_round()
    return rounds / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: runs are not disturbed by other processes)",
    )
    parser.add_argument(
        "--out", default=str(Path(__file__).parent / "results" / "engine_throughput.json")
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    for label, model in (("logreg", "linear"), ("cnn", "cnn")):
        for runner in ("vectorized", "sequential", "centralized"):
            samples = [
                time_centralized(model, args.rounds)
                if runner == "centralized"
                else time_engine(model, runner, args.rounds)
                for _ in range(args.repeats)
            ]
            rps = statistics.median(samples)
            results[f"{label}/{runner}"] = {
                "rounds_per_s": rps,
                "examples_per_s": rps * M * K * B,
                "samples_rounds_per_s": samples,
            }
            print(
                f"{label:7s} {runner:12s} {rps:8.2f} rounds/s  {rps * M * K * B:10.0f} examples/s",
                flush=True,
            )
    out = {
        "benchmark": "engine_throughput",
        "setting": {
            "M": M,
            "K": K,
            "B": B,
            "rounds": args.rounds,
            "repeats": args.repeats,
            "threads": args.threads,
            "task": "digits (50 clients)",
        },
        "environment": environment(),
        "results": results,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
