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


def test_the_quick_start_against_its_ray_path_pair_by_pair(bench) -> None:
    runs = [
        {**_run("fedtune", 30.0), "repeat": 0},
        {**_run("fedtune_ray", 40.0), "repeat": 0},
        {**_run("fedtune_ray", 50.0), "repeat": 1},
        {**_run("fedtune", 45.0), "repeat": 1},
        {**_run("fedtune", 20.0), "repeat": 2},  # its pair did not run
    ]
    summary = bench.summarize(runs)
    assert summary["fedtune"]["ratio_over_fedtune_ray_pairs"] == [0.75, 0.9]
    assert summary["fedtune_ray"]["total_s_median"] == pytest.approx(45.0)
