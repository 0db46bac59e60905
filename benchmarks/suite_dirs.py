"""The test suite's time per directory and per file, from pytest's JUnit XML:
``python benchmarks/suite_dirs.py --junit run.xml [run2.xml ...] --label NAME --wall-s S``.

Run the suite with ``--junitxml=FILE`` (``make test PYTEST_ARGS=--junitxml=FILE``, with the
``FEDTUNE_REQUIRE_*`` variables of ``.ci/run`` set so nothing CI runs is skipped), then give this
script the file(s): several files are one run split in parts (e.g. an interrupted run and the
rest). Each test's time is its setup, call and teardown (pytest's ``junit_duration_report``
default), so a session fixture counts once, in the test that first asks for it. The sums are
worker-seconds: on two pytest-xdist workers the wall time is about half their total when both
stay busy. The report (directories, the slowest files, the run's wall time and the machine) is
added under ``--label`` to ``benchmarks/results/suite_dirs.json``; a label given again replaces
its entry.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

RESULTS = Path(__file__).resolve().parent / "results" / "suite_dirs.json"


def per_file(junit_files: list[Path]) -> tuple[Counter, Counter]:
    """Seconds and test counts per test file, summed over the JUnit files.

    Args:
        junit_files: pytest ``--junitxml`` outputs.

    Returns:
        ``(seconds, tests)``, each keyed by the file's path (``tests/e2e/test_x.py``).
    """
    seconds, tests = Counter(), Counter()
    for junit in junit_files:
        for case in ET.parse(junit).iter("testcase"):
            name = case.get("classname", "").replace(".", "/") + ".py"
            seconds[name] += float(case.get("time") or 0.0)
            tests[name] += 1
    return seconds, tests


def per_directory(seconds: Counter, tests: Counter) -> dict[str, dict[str, float]]:
    """The files' sums per directory under ``tests/``, slowest first."""
    dirs: dict[str, dict[str, float]] = {}
    for name, spent in seconds.items():
        folder = "/".join(name.split("/")[:2])
        entry = dirs.setdefault(folder, {"seconds": 0.0, "tests": 0})
        entry["seconds"] += spent
        entry["tests"] += tests[name]
    return {
        k: {"seconds": round(v["seconds"], 1), "tests": int(v["tests"])}
        for k, v in sorted(dirs.items(), key=lambda kv: -kv[1]["seconds"])
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junit", type=Path, nargs="+", required=True)
    parser.add_argument("--label", required=True, help="e.g. the commit and 'before'/'after'")
    parser.add_argument("--wall-s", type=float, help="the run's wall time, if known")
    parser.add_argument("--note", default="", help="how the run was made (load, image cache)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    seconds, tests = per_file(args.junit)
    entry = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "environment": environment(),
        "note": args.note,
        "wall_s": args.wall_s,
        "tests": sum(tests.values()),
        "worker_seconds": round(sum(seconds.values()), 1),
        "directories": per_directory(seconds, tests),
        "slowest_files": [
            {"file": name, "seconds": round(spent, 1), "tests": tests[name]}
            for name, spent in seconds.most_common(args.top)
        ],
    }
    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    report.setdefault("benchmark", "suite_dirs")
    report.setdefault("runs", {})[args.label] = entry
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for folder, row in entry["directories"].items():
        print(f"{folder:<20} {row['tests']:>5} tests {row['seconds']:>8.1f} s")
    return entry


if __name__ == "__main__":
    main()
