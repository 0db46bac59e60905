"""The test suite's wall time on one process and on pytest-xdist workers: ``python
benchmarks/suite_time.py``.

Runs ``pytest -n W --dist loadgroup`` (``make test``'s command; ``W = 0``: one process) for each
``--workers`` value, ``--repeats`` times, the order reversed every other repeat so that neither
count always runs on a warmer machine. Each run records its wall time, the fraction of the
machine's CPU time that was busy while it ran (``/proc/stat``, sampled every
``--sample-s``), its outcome counts and exit code. Medians per worker count go to
``benchmarks/results/suite_time.json`` with the machine, versions and load averages.

Run it as CI runs the suite, with the ``FEDTUNE_REQUIRE_*`` variables of ``.ci/run`` set, so
that nothing is skipped that CI runs; the JSON records which were set. ``--select`` narrows
the run to some tests (the tool's own test uses it). Needs ``.venv`` (``make test`` makes it)
and, on a fresh machine, builds the image once in the first run: run it twice or read the
first run apart.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _env import environment

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "suite_time.json"
OUTCOMES = ("passed", "failed", "errors", "skipped", "deselected", "xfailed", "xpassed")
_COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)\b")


def cpu_times() -> tuple[int, int]:
    """The machine's CPU time so far, all and idle (``iowait`` counted idle), in ticks."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


class BusySampler:
    """The busy fraction of the machine's CPU time, sampled in a thread.

    Args:
        every_s: Seconds between samples.
    """

    def __init__(self, every_s: float) -> None:
        self.every_s, self.samples = every_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BusySampler:
        self._start = cpu_times()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.total = self._busy(self._start, cpu_times())

    @staticmethod
    def _busy(before: tuple[int, int], after: tuple[int, int]) -> float:
        all_, idle = after[0] - before[0], after[1] - before[1]
        return 1.0 - idle / all_ if all_ else 0.0

    def _run(self) -> None:
        last = self._start
        while not self._stop.wait(self.every_s):
            now = cpu_times()
            self.samples.append(self._busy(last, now))
            last = now


def counts(output: str) -> dict[str, int]:
    """The outcome counts of pytest's last summary line (``3 passed, 1 skipped in 2.0s``).

    Args:
        output: pytest's output.

    Returns:
        ``{outcome: count}`` over :data:`OUTCOMES` (``error``/``errors`` as ``errors``).
    """
    found = {k: 0 for k in OUTCOMES}
    lines = [line for line in output.splitlines() if re.search(r" in [\d.]+s", line)]
    for number, outcome in _COUNT.findall(lines[-1] if lines else ""):
        found["errors" if outcome.startswith("error") else outcome] += int(number)
    return found


def run_suite(workers: int, select: list[str], log: Path, every_s: float) -> dict[str, Any]:
    """One run of the suite on ``workers`` pytest-xdist workers (0: one process).

    Args:
        workers: The ``-n`` value.
        select: Extra pytest arguments (tests to run; empty: the whole suite).
        log: Where pytest's output goes.
        every_s: Seconds between CPU samples.

    Returns:
        ``workers``, ``wall_s``, ``cpu_busy_fraction`` (of the machine's cores, over the run),
        ``cpu_busy_median_sample``, ``counts`` and ``exit_code``.
    """
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["-n", str(workers), "--dist", "loadgroup", *select]
    # a run started from inside pytest (the tool's own test) must not inherit its variables
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with log.open("w") as out, BusySampler(every_s) as busy:
        started = time.monotonic()
        done = subprocess.run(
            cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        )
        wall = time.monotonic() - started
    return {
        "workers": workers,
        "wall_s": round(wall, 1),
        "cpu_busy_fraction": round(busy.total, 3),
        "cpu_busy_median_sample": (
            round(statistics.median(busy.samples), 3) if busy.samples else None
        ),
        "counts": counts(log.read_text(errors="replace")),
        "exit_code": done.returncode,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--select", nargs=argparse.REMAINDER, default=[], help="pytest args")
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started_env = environment()
    runs = []
    with tempfile.TemporaryDirectory(prefix="suite-time-") as logs:
        for repeat in range(args.repeats):
            order = args.workers if repeat % 2 == 0 else args.workers[::-1]
            for workers in order:
                run = run_suite(
                    workers, args.select, Path(logs) / f"{repeat}-{workers}.log", args.sample_s
                )
                run["repeat"] = repeat
                print(json.dumps(run), flush=True)
                runs.append(run)
    medians = {
        str(w): statistics.median(r["wall_s"] for r in runs if r["workers"] == w)
        for w in args.workers
    }
    report = {
        "benchmark": "suite_time",
        "environment": started_env,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "command": "python benchmarks/suite_time.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "select": args.select or "the whole suite",
        "required": sorted(
            k for k, v in os.environ.items() if k.startswith("FEDTUNE_REQUIRE_") and v == "1"
        ),
        "repeats": args.repeats,
        "runs": runs,
        "median_wall_s": medians,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
