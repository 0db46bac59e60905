"""benchmarks/suite_dirs.py: a run's JUnit files summed per directory and per file."""

from __future__ import annotations

import json

from tests.benchmarks import load_benchmark

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.e2e.test_a" name="t1" time="10.5"/>
<testcase classname="tests.e2e.test_a" name="t2" time="1.5"/>
<testcase classname="tests.unit.test_b" name="t3" time="0.25"/>
</testsuite></testsuites>
"""
REST = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.unit.test_c" name="t4" time="3.0"/>
</testsuite></testsuites>
"""


def test_parts_of_one_run_are_summed_per_directory_and_file(tmp_path) -> None:
    bench = load_benchmark("suite_dirs.py")
    (tmp_path / "a.xml").write_text(JUNIT)
    (tmp_path / "b.xml").write_text(REST)
    out = tmp_path / "dirs.json"
    argv = ["--junit", str(tmp_path / "a.xml"), str(tmp_path / "b.xml"), "--out", str(out)]
    bench.main([*argv, "--label", "before", "--wall-s", "9"])
    entry = bench.main([*argv, "--label", "after"])
    assert entry["tests"] == 4 and entry["worker_seconds"] == 15.2
    assert entry["directories"] == {
        "tests/e2e": {"seconds": 12.0, "tests": 2},
        "tests/unit": {"seconds": 3.2, "tests": 2},
    }
    assert entry["slowest_files"][0] == {"file": "tests/e2e/test_a.py", "seconds": 12.0, "tests": 2}
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"before", "after"}  # a second label adds, it does not replace
    assert report["runs"]["before"]["wall_s"] == 9 and report["runs"]["after"]["wall_s"] is None
    assert report["runs"]["after"]["environment"]["versions"]["torch"]
