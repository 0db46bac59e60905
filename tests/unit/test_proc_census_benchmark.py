"""benchmarks/proc_census.py: every process a command starts, its CPU charged to the test that
started it (its own ``PYTEST_CURRENT_TEST``, else its nearest ancestor's)."""

from __future__ import annotations

import sys

from tests.benchmarks import load_benchmark

#: a "test" that starts a child which burns CPU, and a grandchild whose environment is cleared
#: (as a sandbox clears it): both are charged to the test through their ancestry. Each idles a
#: second after its spin, so that a sample sees its whole CPU however late the sampler wakes.
SPIN = (
    "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    "time.sleep(1.0)\n"
)
CHILD = (
    "import os, subprocess, sys\n"
    + SPIN.format(s=0.6)
    + "subprocess.run([sys.executable, '-c', {grand!r}], env={{'PATH': os.environ['PATH']}})\n"
)


def test_a_childs_cpu_is_charged_to_the_test_that_started_it(tmp_path) -> None:
    bench = load_benchmark("proc_census.py")
    grand = SPIN.format(s=0.8)
    code = CHILD.format(grand=grand)
    command = [
        "env",
        "PYTEST_CURRENT_TEST=tests/unit/test_x.py::test_y (call)",
        sys.executable,
        "-c",
        code,
    ]
    raw = bench.sample(command, 0.1, tmp_path / "raw.json")
    assert raw["returncode"] == 0
    report = bench.report(raw, top=10)
    charged = report["test_files"]["tests/unit/test_x.py"]
    assert charged["processes"] >= 2  # the child and the grandchild with no variable of its own
    assert charged["cpu_s"] >= 1.4  # 0.6 + 0.8 s spun
    assert report["cpu_s_outside_pytest"] >= charged["cpu_s"]


def test_kinds_come_from_the_command_line() -> None:
    bench = load_benchmark("proc_census.py")
    worker = {"argv": ["python", "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]}
    assert bench.kind_of(worker) == "pytest worker"
    ray = {"argv": ["python", "/x/ray/_private/workers/default_worker.py"], "comm": "ray::IDLE"}
    assert bench.kind_of(ray) == "ray worker"
    assert bench.kind_of({"argv": ["/v/bin/fedtune", "tune", "s.yaml"]}) == "fedtune"
    assert bench.kind_of({"argv": [], "comm": "kworker"}) == "kworker"
