"""The driver's own CPU and the wall time of a tiny ``fedtune tune``, for source trees side by side.

Each run is a fresh ``python -c`` that calls ``fedtune.cli.main(["tune", SPEC, "--workdir",
<fresh dir>])`` with ``PYTHONPATH`` set to one tree and prints ``time.process_time()`` at the
end: the driver process's CPU from its start, its threads included and its child processes
(the MLflow store's process) not; the wall time is the whole process's. Trees are interleaved,
one warm-up round (bytecode caches) is not counted, and the medians are printed with every
value. The default study is the 2-trial quadratic of ``tests/integration/conftest.py`` with
``budget: {trials: 2, max_concurrent: 1}`` and ``scheduler: none``, which trains in the driver's
process (``docs/explanation/architecture.md``, *Trials in the driver's process*).

    python benchmarks/driver_cpu.py --tree before=/path/to/main --tree after=. --repeats 5 \
        --out benchmarks/results/driver_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._env import write_report
from tests.integration.conftest import make_quadratic_study

#: the 2-trial quadratic of the integration tests, one configuration at a time, no scheduler
STUDY = make_quadratic_study(
    "quad", scheduler={"name": "none"}, budget={"trials": 2, "max_concurrent": 1}
)

CODE = """
import contextlib, io, sys, time
from fedtune.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(["tune", sys.argv[1], "--workdir", sys.argv[2]])
print(code, time.process_time(), "ray" in sys.modules)
"""


def run(tree: Path, spec: Path, workdir: Path) -> tuple[float, float, bool]:
    """One fresh driver on ``tree``'s sources: ``(its CPU-s, the wall s, whether it imported
    Ray)``."""
    shutil.rmtree(workdir, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CODE, str(spec), str(workdir)],
        env=env,
        cwd=workdir.parent,  # not a tree: ``python -c`` puts its directory first on sys.path
        capture_output=True,
        text=True,
        check=True,
    )
    wall = time.perf_counter() - start
    code, cpu, ray = out.stdout.split()
    if code != "0":
        raise SystemExit(f"fedtune tune exited {code} on {tree}: {out.stderr[-2000:]}")
    return float(cpu), wall, ray == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", required=True, help="NAME=PATH (repeatable)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--spec", type=Path, help="a study file (default: the 2-trial quadratic)")
    parser.add_argument("--out", type=Path, help="write the medians and every value as JSON here")
    args = parser.parse_args()
    started = time.time()
    trees = {k: Path(v).resolve() for k, v in (t.split("=", 1) for t in args.tree)}
    with tempfile.TemporaryDirectory() as tmp:
        spec = args.spec or Path(tmp) / "study.json"
        if args.spec is None:
            spec.write_text(json.dumps(STUDY))
        values: dict[str, dict[str, list[float]]] = {k: {"cpu": [], "wall": []} for k in trees}
        for i in range(args.repeats + 1):
            for name, tree in trees.items():
                cpu, wall, ray = run(tree, spec, Path(tmp) / f"w-{name}")
                print(f"{name} {i}: cpu {cpu:.2f} s, wall {wall:.2f} s, ray imported: {ray}")
                if i:  # round 0 warms the bytecode caches
                    values[name]["cpu"].append(round(cpu, 2))
                    values[name]["wall"].append(round(wall, 2))
    medians = {}
    for name, v in values.items():
        cpu, wall = statistics.median(v["cpu"]), statistics.median(v["wall"])
        medians[name] = {"cpu_s": cpu, "wall_s": wall}
        print(f"{name}: median cpu {cpu:.2f} s, wall {wall:.2f} s {json.dumps(v)}")
    if args.out is not None:
        body = {"benchmark": "driver_cpu", "trees": {k: str(v) for k, v in trees.items()}}
        body |= {"repeats": args.repeats, "medians": medians, "values": values}
        write_report(args.out, body, started, "benchmarks/driver_cpu.py", sys.argv[1:])


if __name__ == "__main__":
    main()
