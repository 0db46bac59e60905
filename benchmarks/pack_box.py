"""The packed study's ``PackBox`` actor: its resident memory and the cost of one question.

Every packed study runs one :class:`fedtune.tuning.packing.box.PackBox` (stops and refills). This
starts a local Ray, creates the box as a study does (``num_cpus=0``) and measures:

* ``rss_mb``: the actor process's resident memory, and whether torch was imported in it
  (``torch_imported``: the box's module imports only the standard library);
* ``poll_ms``: one ``poll`` round trip (``ray.get`` of ``box.poll.remote``), the question a pack
  of one asks at its reports; ``answer_ready_ms``: one ``answer`` round trip when the driver has
  already answered that report, the question a pack that takes refills asks.

Each measure is taken in ``--sessions`` fresh Ray sessions; the JSON has every value and the
median. Writes ``benchmarks/results/pack_box.json``::

    python benchmarks/pack_box.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _env import environment, memory_mib

OUT = Path(__file__).resolve().parent / "results" / "pack_box.json"


def _actor_facts(self) -> tuple[int, bool]:  # runs in the actor (``__ray_call__``)
    return os.getpid(), "torch" in sys.modules


def one_session(calls: int) -> dict:
    """One Ray session: the box's RSS and the median round trips of ``calls`` questions."""
    import ray

    from fedtune.tuning.packing.box import PackBox

    temp = tempfile.mkdtemp(prefix="ft-box-", dir="/tmp")  # its own: short socket paths
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, _temp_dir=temp)
    try:
        box = ray.remote(PackBox).options(num_cpus=0).remote()
        pid, torch_imported = ray.get(box.__ray_call__.remote(_actor_facts))
        live = list(range(8))
        polls, waits = [], []
        for i in range(calls):
            t0 = time.perf_counter()
            ray.get(box.poll.remote("pack-0000", live))
            polls.append(time.perf_counter() - t0)
            ray.get(box.offer.remote("pack-0001", [], i))
            t0 = time.perf_counter()
            ray.get(box.answer.remote("pack-0001", i, live))
            waits.append(time.perf_counter() - t0)
        return {
            "rss_mb": round(memory_mib(pid)["VmRSS"], 1),
            "torch_imported": torch_imported,
            "poll_ms": round(statistics.median(polls) * 1e3, 3),
            "answer_ready_ms": round(statistics.median(waits) * 1e3, 3),
        }
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    runs = [one_session(args.calls) for _ in range(args.sessions)]
    result = {
        "benchmark": "pack_box",
        "environment": environment(),
        "sessions": runs,
        "median": {
            k: statistics.median(r[k] for r in runs)
            for k in ("rss_mb", "poll_ms", "answer_ready_ms")
        },
        "torch_imported": any(r["torch_imported"] for r in runs),
        "command": "python benchmarks/pack_box.py " + " ".join(argv or sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median"]), "torch imported:", result["torch_imported"])
    return result


if __name__ == "__main__":
    main()
