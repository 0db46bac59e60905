"""Drawing a pack's batch rows: every stream's ``Generator.integers`` against one pass over all.

A pack of P configurations draws the batch rows of P·M (configuration, client) streams every
round (``with_replacement``, M = 10 clients, K = 10 steps of B = 20 rows, client sizes of 50 to
400 examples). Two ways, each timed over ``--rounds`` rounds, interleaved ``--repeats`` times:

* ``per_stream`` — each stream seeded (``fedtune.trainers.streams.generators``) and drawn with
  NumPy's ``Generator.integers`` (how the engine drew them before);
* ``vectorised`` — :func:`fedtune.trainers.sampling.trials_batch_indices`: each stream's raw
  words, then Lemire's bounded draws of all streams at once, bit-identical to the first way.

Milliseconds per round are medians. On a GPU these draws are host time in every round of a pack
(docs/explanation/packing.md, "CUDA graphs"). Writes ``benchmarks/results/batch_rows.json``.

Usage::

    python benchmarks/batch_rows.py [--sizes 1,64,256] [--repeats 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

from fedtune.trainers.sampling import batch_streams, trials_batch_indices
from fedtune.trainers.streams import generators

RESULTS = Path(__file__).parent / "results"
M, K, B = 10, 10, 20


def per_stream(seeds, t, clients, offsets, counts) -> list[torch.Tensor]:
    """Each stream's ``Generator.integers``, as the engine drew the rows before."""
    cohort, sizes = clients.tolist(), counts.tolist()
    rngs = generators([row for s in seeds for row in batch_streams(s, t, cohort)])
    out = []
    for _ in seeds:
        local = np.empty((len(cohort), K * B), dtype=np.int64)
        for i, n in enumerate(sizes):
            local[i] = next(rngs).integers(0, n, size=K * B)
        local += offsets.numpy()[:, None]
        out.append(torch.from_numpy(local).view(len(cohort), K, B))
    rngs.close()
    return out


def vectorised(seeds, t, clients, offsets, counts) -> list[torch.Tensor]:
    """The engine's draws (:func:`trials_batch_indices`)."""
    return trials_batch_indices(
        seeds, t, clients, offsets, counts, [K] * len(seeds), B, "with_replacement"
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,64,256", help="P values, comma-separated")
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(50, 401, (M,), generator=gen)
    offsets = torch.cumsum(counts, 0) - counts
    clients = torch.arange(M) * 7
    results = {}
    for p in (int(s) for s in args.sizes.split(",")):
        seeds = list(range(p))
        a, b = (
            per_stream(seeds, 0, clients, offsets, counts),
            vectorised(seeds, 0, clients, offsets, counts),
        )
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True)), "the rows differ"
        ms: dict[str, list[float]] = {"per_stream": [], "vectorised": []}
        for _ in range(args.repeats):
            for name, draw in (("per_stream", per_stream), ("vectorised", vectorised)):
                start = time.perf_counter()
                for t in range(args.rounds):
                    draw(seeds, t, clients, offsets, counts)
                ms[name].append((time.perf_counter() - start) * 1e3 / args.rounds)
        row = {k: {"ms_per_round": statistics.median(v), "samples": v} for k, v in ms.items()}
        row["speedup"] = round(
            row["per_stream"]["ms_per_round"] / row["vectorised"]["ms_per_round"], 2
        )
        results[str(p)] = row
        print(
            f"P={p}: per stream {row['per_stream']['ms_per_round']:.2f} ms, vectorised "
            f"{row['vectorised']['ms_per_round']:.2f} ms ({row['speedup']}x)"
        )
    doc = {
        "benchmark": "batch_rows",
        "setting": {
            "M": M,
            "K": K,
            "B": B,
            "mode": "with_replacement",
            "client_sizes": counts.tolist(),
            "rounds": args.rounds,
            "repeats": args.repeats,
            "statistic": "median",
        },
        "command": "python benchmarks/batch_rows.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "environment": environment(),
        "results": results,
    }
    out = args.out or RESULTS / "batch_rows.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    main()
