"""What ``resources.pack: auto`` decides on each search-suite task, and what deciding costs.

    .venv/bin/python benchmarks/pack_probe.py [--tasks ...] [--size 8] [--repeats 5]
        [--out benchmarks/results/pack_probe.json]

For each task of the suite (``search_tasks.py``, the held-out task included) the probe that
``auto`` runs before it packs on CPUs (:func:`fedtune.tuning.packing.speed.measure`: P
configurations drawn from the study's space, 3 timed rounds each by itself and as one pack) runs
``--repeats`` times, each in a fresh process, as a study's Ray task runs it once. Reported per
task: the probe's speed-ups and decisions (packs when ≥ ``PAYS``), its wall time (the task's
build, the draws and the rounds), and, where ``search_pack_speed.py``'s report has it, the
speed-up that full measurement gave at the same P (whole runs of grid points, interleaved
repeats), with whether the two fall on the same side of ``PAYS``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _env import write_report  # noqa: E402
from search_tasks import HELD_OUT, TASKS  # noqa: E402

_ONE = """
import json, sys, time
sys.path.insert(0, {here!r})
start = time.perf_counter()
from search_tasks import task_spec
from fedtune.tuning.packing.plan import refusal
from fedtune.tuning.packing.speed import measure
spec = task_spec({task!r})
why = refusal(spec)
found = None if why else measure(spec, {size})
print(json.dumps({{
    "refusal": why,
    "speedup": None if found is None else found.speedup,
    "packed_per_s": None if found is None else found.packed,
    "unpacked_per_s": None if found is None else found.unpacked,
    "why": None if found is None else found.why,
    "pays": bool(found and found.pays),
    "wall_s": time.perf_counter() - start,
}}))
"""


def probe(task: str, size: int) -> dict[str, Any]:
    """One probe of ``task`` in a fresh process (imports, the task's build and all)."""
    code = _ONE.format(here=str(HERE), task=task, size=size)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def full_speedup(report: dict[str, Any] | None, task: str, size: int) -> float | None:
    """``search_pack_speed.py``'s speed-up of ``task`` at ``size`` (None: not measured)."""
    entry = ((report or {}).get("tasks") or {}).get(task) or {}
    at = (entry.get("by_size") or {}).get(str(size))
    return None if at is None else float(at["speedup"])


def main(argv: list[str] | None = None) -> int:
    from fedtune.tuning.packing.speed import PAYS

    every = [*TASKS, *HELD_OUT]
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=every, choices=every)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--speed", type=Path, default=HERE / "results" / "search_pack_speed.json")
    parser.add_argument("--out", default=str(HERE / "results" / "pack_probe.json"))
    args = parser.parse_args(argv)
    speed = json.loads(args.speed.read_text()) if args.speed.is_file() else None
    started = time.time()
    tasks: dict[str, Any] = {}
    for task in args.tasks:
        runs = [probe(task, args.size) for _ in range(args.repeats)]
        if runs[0]["refusal"]:
            tasks[task] = {"packs": False, "refusal": runs[0]["refusal"]}
            print(f"{task}: does not pack ({runs[0]['refusal']})", flush=True)
            continue
        ups = [r["speedup"] for r in runs if r["speedup"] is not None]
        full = full_speedup(speed, task, args.size)
        median = statistics.median(ups) if ups else None
        tasks[task] = {
            "runs": runs,
            "speedups": ups,
            "median_speedup": median,
            "decisions_pack": sum(r["pays"] for r in runs),
            "median_wall_s": statistics.median(r["wall_s"] for r in runs),
            "full_measurement_speedup": full,
            "same_side_as_full": None
            if full is None
            else [(u >= PAYS) == (full >= PAYS) for u in ups],
        }
        print(
            f"{task}: probe x{median if median is None else round(median, 2)} "
            f"(packs {tasks[task]['decisions_pack']}/{len(runs)}), full x{full}, "
            f"{tasks[task]['median_wall_s']:.1f} s",
            flush=True,
        )
    body = {
        "benchmark": "pack_probe",
        "size": args.size,
        "repeats": args.repeats,
        "pays_at": PAYS,
        "statistic": "median over fresh-process repeats",
        "tasks": tasks,
    }
    write_report(args.out, body, started, "benchmarks/pack_probe.py", argv or sys.argv[1:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
