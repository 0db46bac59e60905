"""``benchmarks/suite_time.py``: one run per worker count of a small suite, its outcome
counts read from pytest's summary and the machine's busy CPU fraction in the JSON."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import load_benchmark

SUITE = """
import pytest

def test_a():
    pass

def test_b():
    pass

def test_c():
    pytest.skip("on purpose")

def test_d():
    assert 1 == 2
"""


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("suite_time.py")


def test_counts_read_the_last_summary_line(bench) -> None:
    output = "x\n== 2 passed in 1.0s ==\n3 failed, 10 passed, 1 skipped, 2 errors in 9.50s\n"
    got = bench.counts(output)
    assert (got["failed"], got["passed"], got["skipped"], got["errors"]) == (3, 10, 1, 2)
    assert got["xfailed"] == 0 and bench.counts("no summary")["passed"] == 0


def test_runs_each_worker_count_and_writes_medians(bench, tmp_path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_small.py").write_text(SUITE)
    out = tmp_path / "suite_time.json"
    report = bench.main(
        ["--workers", "0", "1", "--sample-s", "0.2", "--out", str(out), "--select", str(suite)]
    )
    assert json.loads(out.read_text()) == report
    assert [r["workers"] for r in report["runs"]] == [0, 1]
    for run in report["runs"]:
        assert run["counts"]["passed"] == 2 and run["counts"]["skipped"] == 1
        assert run["counts"]["failed"] == 1 and run["exit_code"] == 1
        assert 0.0 <= run["cpu_busy_fraction"] <= 1.0 and run["wall_s"] > 0
    assert set(report["median_wall_s"]) == {"0", "1"}
    assert report["environment"]["cpu_count"] and report["select"] == [str(suite)]
