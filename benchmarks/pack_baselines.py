"""A pack against hand-written ``torch.func`` loops doing the same arithmetic.

The reference the GPU issue aims at: how fast P FedAvgM configurations of the digits MLP
(M = 10 clients per round, K = 10 local steps, B = 16; γ, η and β differing per configuration)
could train if the host did nothing but launch the arithmetic. Three ways, side by side in one
run, each timed for about ``--target`` seconds per sample after two warm-up rounds:

* ``pack`` — :class:`fedtune.trainers.packed.PackedTrainer` of the P configurations
  (``benchmarks/packing.py``'s configurations, evaluation off); on a GPU its local steps are
  replayed as CUDA graphs (``graphs_recorded`` says how many were captured, ``graphs_failed``
  why none could be); ``pack_eager`` (CUDA only) is the same pack with ``graphs=False``, and
  ``pack_rows_in_round`` (CUDA only) the same pack drawing each round's batch rows when the
  round opens (``rows_ahead=False``) instead of while the round before runs on the device;
* ``loop`` — one round is: draw each configuration's M clients and every (client, step) batch's
  B rows on the device (``torch.rand``, no host round trip), ``vmap(grad)`` of the cross-entropy
  over all P·M (configuration, client) pairs for each of the K steps (SGD at the pair's γ), the
  mean client update Δ per configuration, and the momentum server step per configuration
  (v ← β v + Δ, x ← x − η v);
* ``graph`` (CUDA only) — the same round captured once as a CUDA graph and replayed: the
  host issues one launch per round. Its rate is the ceiling the issue measures the pack
  against (about 22,000 configuration-rounds/s on an H100 at P = 1,024).

Configuration-rounds/s = P · rounds / seconds (medians over ``--repeats`` samples). The JSON
also gives the training FLOPs of one configuration-round (6 per weight and example) and what
each rate means in FLOP/s. Writes ``benchmarks/results/pack_baselines.json`` (``_cuda`` with
``--device cuda``).

Usage::

    python benchmarks/pack_baselines.py [--device cpu] [--sizes 1,8,64] [--repeats 3]
    python benchmarks/pack_baselines.py --device cuda --sizes 1,64,256,1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.func import functional_call, grad, vmap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment, sync
from packing import K, M, configs, graph_fields, mlp_flops_per_config_round, time_rounds

RESULTS = Path(__file__).parent / "results"
B = 16


class HandLoop:
    """P FedAvgM configurations of the digits MLP as one hand-written ``torch.func`` round.

    Args:
        p: Configurations.
        device: Where everything lives.
        seed: Seeds the model and the device's generator.
    """

    def __init__(self, p: int, device: str, seed: int = 0) -> None:
        from fedtune.trainers.tasks.registry import build_task

        cfgs = configs("mlp", p, device)
        params = {k: v for k, v in cfgs[0]["task"].items() if k not in ("name", "seed")}
        task = build_task("digits", params, 0)
        data = task.train.to(device, torch.float32)
        self.x, self.y = data.inputs.reshape(data.inputs.shape[0], -1), data.targets.long()
        self.offsets = data.offsets.to(device)
        self.counts = data.counts.to(device)
        self.p, self.device = p, torch.device(device)
        self.module = task.model_fn(torch.Generator().manual_seed(seed)).to(device)
        start = {k: v.detach() for k, v in self.module.named_parameters()}
        self.server = {k: v.expand(p, *v.shape).clone() for k, v in start.items()}
        self.momentum = {k: torch.zeros_like(v) for k, v in self.server.items()}

        def vector(key: str) -> torch.Tensor:
            return torch.tensor([c["hparams"][key] for c in cfgs], device=device)

        self.gamma = vector("client_lr").repeat_interleave(M)  # one per (configuration, client)
        self.eta, self.beta = vector("server_lr"), vector("server_momentum")
        self.grads = vmap(grad(self._loss))
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def _loss(self, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
        logits = functional_call(self.module, params, (x,))
        return torch.nn.functional.cross_entropy(logits, y)

    def _batches(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each pair's K batches of B rows, drawn on the device: ``[K, P·M, B, …]``."""
        p, n = self.p, self.counts.shape[0]
        u = torch.rand(p, n, device=self.device, generator=self.generator)
        clients = u.argsort(dim=1)[:, :M].reshape(-1)  # M distinct clients per configuration
        draw = torch.rand(K, p * M, B, device=self.device, generator=self.generator)
        rows = self.offsets[clients][:, None] + (draw * self.counts[clients][:, None]).long()
        return self.x[rows], self.y[rows]

    def step(self) -> None:
        """One round of every configuration (FedAvgM: K local SGD steps per client, the mean
        client update Δ, v ← β v + Δ, x ← x − η v)."""
        xs, ys = self._batches()
        local = {k: v.repeat_interleave(M, dim=0) for k, v in self.server.items()}
        for k in range(K):
            g = self.grads(local, xs[k], ys[k])
            local = {n: v - _per_row(self.gamma, v) * g[n] for n, v in local.items()}
        for n, x in self.server.items():
            delta = x - local[n].reshape(self.p, M, *x.shape[1:]).mean(dim=1)
            self.momentum[n].mul_(_per_row(self.beta, x)).add_(delta)
            x.sub_(_per_row(self.eta, x) * self.momentum[n])


def _per_row(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return values.reshape(-1, *([1] * (like.dim() - 1)))


class GraphLoop:
    """:class:`HandLoop`'s round captured once as a CUDA graph and replayed (CUDA only).

    Args:
        loop: The loop to capture (its tensors are the graph's static buffers).
    """

    def __init__(self, loop: HandLoop) -> None:
        self.loop = loop
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside the graph, as capture requires
                loop.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            loop.step()

    def step(self) -> None:
        self.graph.replay()


def rates(trainer: Any, p: int, device: str, repeats: int, target: float) -> list[float]:
    """Configuration-rounds/s of ``repeats`` samples of about ``target`` seconds each."""
    trainer.step()
    trainer.step()
    per = max(time_rounds(trainer, device, 1), 1e-6)
    rounds = max(1, round(target / per))
    return [p * rounds / time_rounds(trainer, device, rounds) for _ in range(repeats)]


def measure(p: int, device: str, repeats: int, target: float) -> dict[str, Any]:
    """The three ways' configuration-rounds/s at P = ``p`` (see the module docstring)."""
    from fedtune.trainers.packed import PackedTrainer

    batch = [c | {"train": c["train"] | {"batch_size": B}} for c in configs("mlp", p, device)]
    cuda = torch.device(device).type == "cuda"
    pack = PackedTrainer(batch)
    out: dict[str, Any] = {"pack": rates(pack, p, device, repeats, target)}
    if cuda:
        eager = PackedTrainer(batch, graphs=False)
        out["pack_eager"] = rates(eager, p, device, repeats, target)
        in_round = PackedTrainer(batch, rows_ahead=False)
        out["pack_rows_in_round"] = rates(in_round, p, device, repeats, target)
    loop = HandLoop(p, device)
    out["loop"] = rates(loop, p, device, repeats, target)
    if cuda:
        out["graph"] = rates(GraphLoop(HandLoop(p, device)), p, device, repeats, target)
    sync(device)
    row: dict[str, Any] = {
        k: {"config_rounds_per_s": v, "median": statistics.median(v)} for k, v in out.items()
    }
    row.update(graph_fields(pack))
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", default="1,8,64", help="P values, comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", type=float, default=2.0, help="seconds per sample")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    flops = mlp_flops_per_config_round() * B // 20  # packing.py counts its B = 20
    started = time.perf_counter()
    sizes = {}
    for p in (int(s) for s in args.sizes.split(",")):
        row = measure(p, args.device, args.repeats, args.target)
        for way in (v for v in row.values() if isinstance(v, dict)):
            way["tflop_per_s"] = round(way["median"] * flops / 1e12, 4)
        row["pack_over_loop"] = round(row["pack"]["median"] / row["loop"]["median"], 3)
        if "graph" in row:
            row["pack_over_graph"] = round(row["pack"]["median"] / row["graph"]["median"], 3)
        sizes[str(p)] = row
        shown = ", ".join(f"{k} {v['median']:.0f}" for k, v in row.items() if isinstance(v, dict))
        print(f"P={p}: {shown} configuration-rounds/s")
    suffix = "_cuda" if torch.device(args.device).type == "cuda" else ""
    out = {
        "benchmark": "pack_baselines",
        "device": args.device,
        "shape": {"M": M, "K": K, "B": B, "model": "digits mlp 64-128-128-10", "dtype": "float32"},
        "flops_per_config_round": flops,
        "sizes": sizes,
        "wall_s": round(time.perf_counter() - started, 1),
        "environment": environment(),
        "command": "python benchmarks/pack_baselines.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
    }
    path = args.out or RESULTS / f"pack_baselines{suffix}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
