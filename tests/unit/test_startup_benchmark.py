"""benchmarks/startup.py (issue 14 req. 3): one real run of each plain variant, and the goal and
gap derived from runs. Nothing here asserts a timing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("startup.py")


@pytest.mark.parametrize("kind", ["plain", "plain_torch"])
def test_a_plain_run_stamps_its_trial_process(bench, kind, tmp_path: Path) -> None:
    env = {**__import__("os").environ}
    env.pop("RAY_ADDRESS", None)
    run = bench.run_once(kind, 2, tmp_path, env)
    assert run["kind"] == kind and run["trials"] == 2 and len(run["gaps_s"]) == 1
    ph = run["phases"]
    assert 0 < ph["imports"] < ph["trial_process_started_after_launch"] < run["fixed_s"]
    assert ph["trial_process_start_to_entered"] > 0


def _run(kind: str, fixed: float, worker: float) -> dict:
    phases = {"imports": 1.0, "trial_process_start_to_entered": worker}
    if kind == "fedtune":
        phases = {"ray_start_began_after_launch": 0.1, "trial_process_start_to_entered": worker}
    return {"kind": kind, "trials": 6, "fixed_s": fixed, "total_s": fixed + 5,
            "trial_work_s": 0.01, "gaps_s": [0.05] * 5, "phases": phases}  # fmt: skip


def test_the_goal_and_the_same_work_comparison(bench) -> None:
    report = {"runs": [_run("plain", 7.0, 1.0), _run("plain_torch", 8.5, 2.4),
                       _run("fedtune", 8.0, 2.3)]}  # fmt: skip
    bench.derive(report)
    goal, gap = report["goal"], report["gap"]
    assert not goal["fixed_met"] and goal["fixed_ratio_fedtune_over_plain"] == pytest.approx(8 / 7)
    assert goal["same_work_fixed_met"]
    assert goal["fixed_ratio_fedtune_over_plain_torch"] == pytest.approx(8 / 8.5)
    assert gap["before_ray_start_s"] == {"fedtune": 0.1, "plain": 1.0}
    assert gap["ray_start_to_first_trial_s"]["plain_torch_trial_process_start_to_entered"] == 2.4
    report = {"runs": [_run("plain", 7.0, 1.0), _run("fedtune", 6.0, 2.3)]}
    bench.derive(report)
    assert report["goal"]["fixed_met"] and "same_work_fixed_met" not in report["goal"]
