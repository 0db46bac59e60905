"""What a configuration-round of each search-suite task costs packed and unpacked: the wall-time
side of comparing search strategies at equal compute (issue 42).

    .venv/bin/python benchmarks/search_pack_speed.py [--tasks ...] [--sizes 4 8 16]
        [--repeats 3] [--out benchmarks/results/search_pack_speed.json]
    .venv/bin/python benchmarks/search_pack_speed.py --merge PART.json ... --out OUT.json

For each task of the suite (``search_tasks.py``) and each pack size P, P configurations are drawn
from the task's grid points that did not diverge (a seeded shuffle), so a pack stays full for
all its rounds, as a packed study keeps it by refilling the place of a member that ended, and
trained to their end twice, interleaved, ``--repeats`` times:

* **unpacked**: one after another, each by the engine (``run_trial`` on the task's built data),
  as a study without packing trains a trial in its process;
* **packed**: all P as one :class:`~fedtune.trainers.packed.PackedTrainer`, to its end.

Each side's figure is configuration-rounds run (a diverged configuration stops at its round)
per wall second; the speed-up is packed ÷ unpacked (median over repeats). One torch thread,
the suite's setting. What the figures leave out favours the unpacked side: a real unpacked
study also pays, per trial, a Ray Tune trial start and, per round, a report through Ray
(``startup.py`` measures those), which a pack pays once for P configurations.

A task whose algorithm cannot pack (``byo``: its aggregator has no packed form) is listed with
the reason.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _env import write_report  # noqa: E402
from search_tasks import HELD_OUT, TASKS, Task, grid_of  # noqa: E402

from fedtune.search_spaces import grid_points  # noqa: E402
from fedtune.trainers import run_trial  # noqa: E402
from fedtune.trainers.packed import PackedTrainer, pack_refusal  # noqa: E402


def _unpacked(task: Task, configs: list[Any]) -> tuple[int, float]:
    start = time.perf_counter()
    rounds = sum(run_trial(c, task=task.data).rounds_completed for c in configs)
    return rounds, time.perf_counter() - start


def _packed(task: Task, configs: list[Any]) -> tuple[int, float]:
    start = time.perf_counter()
    pack = PackedTrainer(configs, task=task.data)
    while not pack.done:
        pack.step()
    rounds = sum(pack.result(i).rounds_completed for i in range(len(configs)))
    return rounds, time.perf_counter() - start


def _completing(task: Task, points: list[Any], wanted: int) -> list[Any]:
    """The first ``wanted`` of ``points`` whose runs reach their last round (all, if fewer)."""
    kept = []
    for point in points:
        if run_trial(task.config(point), task=task.data).rounds_completed == task.rounds:
            kept.append(point)
            if len(kept) == wanted:
                break
    return kept


def measure(name: str, sizes: list[int], repeats: int, seed: int = 0) -> dict[str, Any]:
    """Configuration-rounds per second of one task, unpacked and packed, per pack size.

    Args:
        name: The suite's task.
        sizes: Pack sizes P.
        repeats: Interleaved repeats per size.
        seed: The shuffle of the grid's points.

    Returns:
        Per P: the configurations' rounds, each side's rate samples and medians, the speed-up.
    """
    task = Task(name)
    grid = grid_of(name)
    every = grid.get("grid") or grid_points(task.space)  # an older cache: the same order
    values = grid.get("values")  # an older cache has none: a point's run says
    points = [p for i, p in enumerate(every) if values is None or values[i] is not None]
    random.Random(seed).shuffle(points)
    refusal = pack_refusal(task.config(points[0]))
    if refusal is not None:
        return {"packed": False, "note": refusal}
    if values is None:
        points = _completing(task, points, max(sizes))
    out: dict[str, Any] = {"packed": True, "rounds": task.rounds, "by_size": {}}
    _unpacked(task, [task.config(points[0])])  # warm the task's code paths once
    for size in sizes:
        configs = [task.config(p) for p in (points * size)[:size]]  # a small grid: repeats
        rates: dict[str, list[float]] = {"unpacked": [], "packed": []}
        rounds = 0
        for _ in range(repeats):
            for side, run in (("unpacked", _unpacked), ("packed", _packed)):
                rounds, wall = run(task, configs)
                rates[side].append(rounds / wall)
        unpacked, packed = (statistics.median(rates[s]) for s in ("unpacked", "packed"))
        out["by_size"][str(size)] = {
            "configurations": len(configs),
            "configuration_rounds": rounds,
            "unpacked_per_s": rates["unpacked"],
            "packed_per_s": rates["packed"],
            "unpacked_median": unpacked,
            "packed_median": packed,
            "speedup": packed / unpacked,
        }
        print(
            f"{name} P={size}: {unpacked:.0f} -> {packed:.0f} cfg-rounds/s, "
            f"x{packed / unpacked:.2f}",
            flush=True,
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=[*TASKS, *HELD_OUT])
    parser.add_argument("--sizes", nargs="+", type=int, default=[4, 8, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "search_pack_speed.json"))
    parser.add_argument(
        "--merge", nargs="+", type=Path, help="join these reports' tasks into --out, and stop"
    )
    args = parser.parse_args(argv)
    if args.merge:
        parts = [json.loads(path.read_text()) for path in args.merge]
        report = {**parts[0], "tasks": {k: v for p in parts for k, v in p["tasks"].items()}}
        report["command"] = " ; ".join(p["command"] for p in parts)
        report["environments"] = [p["environment"] for p in parts]
        Path(args.out).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
        return 0
    started = time.time()
    tasks = {name: measure(name, args.sizes, args.repeats) for name in args.tasks}
    body = {
        "benchmark": "search_pack_speed",
        "sizes": args.sizes,
        "repeats": args.repeats,
        "statistic": "median over interleaved repeats",
        "tasks": tasks,
    }
    write_report(args.out, body, started, "benchmarks/search_pack_speed.py", argv or sys.argv[1:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
