"""When a test run leaves the machine's CPU idle, and which tests were running then:
``python benchmarks/suite_idle.py --raw RAW.json --timeline TESTS.jsonl`` reads the busy/idle
timeline of ``benchmarks/proc_census.py sample`` and the per-test start and end that
``FEDTUNE_TEST_TIMELINE`` makes ``tests/conftest.py`` write, and charges each sample's idle
CPU-seconds to the tests running in it, split evenly among them.

A test that waits (on a timeout, a lease, a browser, a sleep between polls) leaves a core
idle unless the other worker's test has work for it; the table says which tests those are and
how much of the run had fewer tests running than workers.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proc_census import emit, read_tests


def idle_by_test(raw: dict, tests: list[dict], top: int) -> dict:
    """Charge each sample's idle CPU to the tests that were running in it.

    Args:
        raw: What ``proc_census.py sample`` wrote (``started_at``, ``timeline``).
        tests: One ``{"test", "worker", "start", "end"}`` per test (wall-clock seconds).
        top: Rows kept per table.

    Returns:
        The run's busy and idle CPU-seconds, the idle ones by how many tests were running,
        and the tests and files with the most idle CPU charged to them.
    """
    t0 = raw["started_at"]
    spans = sorted((t["start"] - t0, t["end"] - t0, t["test"]) for t in tests)
    by_test: dict[str, float] = defaultdict(float)
    by_running: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    busy_all = idle_all = 0.0
    previous = 0.0
    for at, busy, idle in raw["timeline"]:
        busy_all, idle_all = busy_all + busy, idle_all + idle
        running = [name for start, end, name in spans if start < at and end > previous]
        entry = by_running[len(running)]
        entry[0] += at - previous
        entry[1] += idle
        for name in running:
            by_test[name] += idle / len(running)
        if not running:
            by_test["(no test running)"] += idle
        previous = at
    by_file: dict[str, float] = defaultdict(float)
    for name, idle in by_test.items():
        by_file[name.split("::", 1)[0]] += idle

    def ranked(table: dict[str, float]) -> dict[str, float]:
        return {k: round(v, 1) for k, v in sorted(table.items(), key=lambda kv: -kv[1])[:top]}

    return {
        "wall_s": raw["wall_s"],
        "cpu_busy_s": round(busy_all, 1),
        "cpu_idle_s": round(idle_all, 1),
        "busy_share": round(busy_all / max(busy_all + idle_all, 1e-9), 3),
        "by_tests_running": {
            str(n): {"wall_s": round(w, 1), "idle_cpu_s": round(i, 1)}
            for n, (w, i) in sorted(by_running.items())
        },
        "idle_by_file": ranked(by_file),
        "idle_by_test": ranked(by_test),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--raw", type=Path, required=True, help="proc_census.py sample's output")
    parser.add_argument("--timeline", type=Path, required=True, help="FEDTUNE_TEST_TIMELINE's")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    tests = read_tests(args.timeline)
    emit(idle_by_test(json.loads(args.raw.read_text()), tests, args.top), args.note, args.out)


if __name__ == "__main__":
    main()
