"""benchmarks/quickstart_cost.py: the medians, the ratios to plain Ray Tune and the goal, from
runs given (the runs themselves take minutes: the benchmark, not the suite, makes them); its
plain script compiles."""

from __future__ import annotations

import pytest

from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("quickstart_cost.py")


def _run(kind: str, total: float, rounds: int = 480) -> dict:
    return {"kind": kind, "total_s": total, "configuration_rounds": rounds, "trials": 16}


def test_medians_and_ratios_to_plain(bench) -> None:
    runs = [
        _run("plain", 100.0),
        _run("fedtune_tpe", 70.0),
        _run("fedtune", 40.0, 300),
        _run("plain", 110.0),
        _run("fedtune_tpe", 90.0),
        _run("fedtune", 50.0, 320),
    ]
    summary = bench.summarize(runs)
    assert summary["plain"]["total_s_median"] == pytest.approx(105.0)
    assert summary["fedtune_tpe"]["ratio_over_plain"] == pytest.approx(80.0 / 105.0)
    assert summary["fedtune"]["ratio_over_plain"] == pytest.approx(45.0 / 105.0)
    assert summary["fedtune"]["configuration_rounds"] == [300, 320]
    assert "ratio_over_plain" not in bench.summarize(runs[1:3])["fedtune_tpe"]  # no plain run


def test_the_plain_script_compiles(bench) -> None:
    compile(bench.PLAIN, "<plain>", "exec")
    assert bench.QUICKSTART.is_file() and bench.KINDS[0] == "plain"
