"""What the sandbox adds to a code check: the same check with bubblewrap and without, interleaved.

Runs ``code_check.check_in_sandbox`` on the test suite's good package (a task registered by user
code, the quadratic underneath) ``--repeats`` times in each mode, alternating, and writes the
medians and their difference. A bare ``bwrap … python -c pass`` against ``python -c pass`` is
timed the same way: the sandbox's own cost without fedtune's imports.

    .venv/bin/python benchmarks/sandbox_latency.py --out benchmarks/results/sandbox_latency.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._env import environment
from fedtune.code_package import pack
from fedtune.sandbox import Sandbox, sandbox_missing
from fedtune.service.code_check import check_in_sandbox
from fedtune.service.settings import load_settings
from tests.service.code_fixtures import write_package
from tests.service.helpers import tiny_spec

PATH = {"PATH": "/usr/bin:/bin"}


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    missing = sandbox_missing()
    if missing is not None:
        print(f"no sandbox here: {missing}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        package = pack(write_package(Path(tmp) / "lab"))
        spec = tiny_spec(name="bench", code={"modules": ["user_lab.tasks"]})
        spec["task"] = {**spec["task"], "name": "user_quadratic"}
        modes = {
            mode: load_settings(workdir=Path(tmp) / "work", code_sandbox=mode)
            for mode in ("bwrap", "none")
        }
        check: dict[str, list[float]] = {"bwrap": [], "none": []}
        bare: dict[str, list[float]] = {"bwrap": [], "none": []}
        pass_argv = [sys.executable, "-I", "-c", "pass"]
        boxed = Sandbox(env={"PATH": "/usr/bin:/bin"}).command(pass_argv)
        for _ in range(args.repeats):
            for mode, settings in modes.items():
                check[mode].append(
                    _timed(lambda s=settings: check_in_sandbox(spec, package.data, s))
                )
                argv = boxed if mode == "bwrap" else pass_argv
                bare[mode].append(_timed(lambda a=argv: subprocess.run(a, check=True, env=PATH)))
    med = {
        f"{k}_{m}": statistics.median(v)
        for k, d in (("check", check), ("bare", bare))
        for m, v in d.items()
    }
    result = {
        "benchmark": "sandbox_latency",
        "argv": sys.argv,
        "environment": environment(),
        "repeats": args.repeats,
        "seconds": {"check": check, "bare_python": bare},
        "median_s": med,
        "added_by_sandbox_s": {
            "check": med["check_bwrap"] - med["check_none"],
            "bare_python": med["bare_bwrap"] - med["bare_none"],
        },
    }
    text = json.dumps(result, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps({"median_s": med, "added_by_sandbox_s": result["added_by_sandbox_s"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
