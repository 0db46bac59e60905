"""benchmarks/refusal.py: its medians and after/before ratios from runs given (the runs take
minutes: the benchmark, not the suite, makes them), and the broken packages it writes."""

from __future__ import annotations

import pytest
import yaml

from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("refusal.py")


def test_medians_per_checkout_and_the_ratio(bench) -> None:
    runs = [
        {"case": "builder_raises_code", "checkout": "before", "error_s": 10.0, "total_s": 12.0},
        {"case": "builder_raises_code", "checkout": "after", "error_s": 4.0, "total_s": 4.5},
        {"case": "builder_raises_code", "checkout": "before", "error_s": 14.0, "total_s": 15.0},
        {"case": "builder_raises_code", "checkout": "after", "error_s": 6.0, "total_s": 6.5},
        {"case": "correct_ray", "checkout": "before", "first_trial_s": 8.0, "total_s": 20.0},
    ]
    summary = bench.summarize(runs)
    row = summary["builder_raises_code"]
    assert row["before"]["error_s_median"] == 12.0 and row["after"]["error_s_median"] == 5.0
    assert row["after"]["error_s_all"] == [4.0, 6.0] and row["before"]["runs"] == 2
    assert row["after_over_before"] == {
        "error_s": pytest.approx(5 / 12, abs=1e-3),
        "total_s": pytest.approx(5.5 / 13.5, abs=1e-3),
    }
    assert "after_over_before" not in summary["correct_ray"]  # one checkout only
    assert summary["correct_ray"]["before"]["first_trial_s_median"] == 8.0


def test_the_broken_packages_and_their_studies(bench, tmp_path) -> None:
    for name, breakage, where, concurrent in bench.CASES:
        study = yaml.safe_load(bench.broken_study(where, concurrent))
        assert study["task"] == {"name": "brk"} and study["budget"]["max_concurrent"] == concurrent
        assert ("code" in study) == (where == "code") and name.startswith(breakage)
        folder = tmp_path / name
        site = bench.make_package(folder, breakage, where)
        compile(
            (folder / ("site" if site else "lab") / "brk" / "tasks.py").read_text(), name, "exec"
        )
        if site is not None:
            assert (
                "brk = brk.tasks"
                in (folder / "site" / "brk-0.1.dist-info" / "entry_points.txt").read_text()
            )
    assert {c[0] for c in bench.CASES} >= {"builder_raises_installed", "model_misfit_code"}
    assert yaml.safe_load(bench.CORRECT)["budget"] == {"trials": 2, "max_concurrent": 1}
