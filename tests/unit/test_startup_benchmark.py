"""benchmarks/startup.py: one real run of each plain variant, and the goal and
gap derived from runs. Nothing here asserts a timing.

Every run that starts a Ray starts a lean one (:func:`_lean`): what the checks read is the
run's stamps and timeline, never Ray's logs, metrics or dashboard."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.benchmarks import BENCHMARKS, load_benchmark
from tests.lean_script import command as lean_command


def _lean(cmd: list[str]) -> list[str]:
    """A run's command (``python -c PLAIN ...``, or ``fedtune tune ... --ray``) under
    ``tests/lean_script.py``: its ``ray.init`` starts a head without log or autoscaler monitor,
    and without the dashboard's web UI modules (nothing here calls them).

    A plain script's trial actors also start without Ray Tune's default ``runtime_env`` (only
    ``PL_DISABLE_FORK``, for PyTorch Lightning, which no trainable here uses), as fedtune's own
    do: each trial process is then one Python start, not ``setup_worker.py`` importing Ray only
    to exec the worker (~1 CPU-s for each of the six plain trials). The phases checked still
    run from that process's start (its pid's start time either way)."""
    plain = cmd[0] == sys.executable
    return lean_command(*(cmd[1:] if plain else cmd), dashboard=False, plain_trial_actors=plain)


@pytest.fixture
def env() -> dict[str, str]:
    """The runs' environment: no outer Ray; ``tests`` importable (the runs' cwd is a scratch
    folder); no idle Python workers prestarted by the plain scripts' Ray (its defaults start
    one per CPU, which no trial uses: each trial gets a worker of its own)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    root = str(BENCHMARKS.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env["RAY_enable_worker_prestart"] = "0"
    env["RAY_prestart_worker_first_driver"] = "0"
    return env


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("startup.py")


@pytest.mark.parametrize("kind", ["plain", "plain_torch"])
def test_a_plain_run_stamps_its_trial_process(bench, kind, tmp_path: Path, env) -> None:
    run = bench.run_once(kind, 2, tmp_path, env, wrap=_lean)
    assert run["kind"] == kind and run["trials"] == 2 and len(run["gaps_s"]) == 1
    ph = run["phases"]
    assert 0 < ph["imports"] < ph["trial_process_started_after_launch"] < run["fixed_s"]
    assert ph["trial_process_start_to_entered"] > 0


def _run(kind: str, fixed: float, worker: float) -> dict:
    phases = {"imports": 1.0, "trial_process_start_to_entered": worker}
    if kind == "fedtune":
        phases = {"ray_start_began_after_launch": 0.1, "trial_process_start_to_entered": worker}
    return {
        "kind": kind,
        "trials": 6,
        "fixed_s": fixed,
        "total_s": fixed + 5,
        "trial_work_s": 0.01,
        "gaps_s": [0.05] * 5,
        "phases": phases,
    }


def test_the_goal_and_the_same_work_comparison(bench) -> None:
    report = {
        "runs": [_run("plain", 7.0, 1.0), _run("plain_torch", 8.5, 2.4), _run("fedtune", 8.0, 2.3)]
    }
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


# -- the whole process ---------------------------------------------------------------------
def test_whole_process_runs_time_each_kind_from_launch_to_exit(bench, tmp_path: Path, env) -> None:
    plain = bench.run_whole("plain_torch", 2, 2, tmp_path, env, wrap=_lean)
    assert plain["trials"] == 2 and len(plain["gaps_s"]) == 1
    ph = plain["phases"]
    assert 0 < ph["imports"] < ph["first_trial_entered_after_launch"] < plain["total_s"]
    assert ph["ray_stop_s"] > 0 and ph["exit_s"] > 0
    common = (
        "interpreter_cli",
        "spec_loaded",
        "driver_imported",
        "optuna_opened_after_launch",
        "mlflow_opened_after_launch",
        "trials",
        "report_s",
        "mlflow_report_s",
        "exit_s",
    )
    for kind, ray_phases in (("fedtune", False), ("fedtune_ray", True)):
        # fedtune without Ray runs as a user runs it (importing Ray for the lean head would
        # cost more than it saves)
        fed = bench.run_whole(kind, 1, 1, tmp_path, env, wrap=_lean if ray_phases else list)
        ph = fed["phases"]
        for phase in common + (("ray_start_s", "ray_stop_s") if ray_phases else ()):
            assert phase in ph and ph[phase] >= 0, (kind, phase, ph)
        if not ray_phases:  # one configuration at a time on the CPU: its trials ran in the driver
            assert "ray_start_s" not in ph and "ray_stop_s" not in ph, ph
        assert ph["first_trial_entered_after_launch"] < fed["total_s"]


def _whole(kind: str, n: int, total: float, repeat: int, gap: float) -> dict:
    return {
        "kind": kind,
        "trials": n,
        "rounds": 3,
        "total_s": total,
        "repeat": repeat,
        "gaps_s": [gap] * (n - 1),
        "phases": {"exit_s": 0.1},
    }


def test_whole_process_ratio_and_per_trial_overhead(bench) -> None:
    report = {
        "runs": [
            _whole("plain_torch", 2, 10.0, 0, 2.0),
            _whole("fedtune", 2, 9.0, 0, 0.05),
            _whole("fedtune", 2, 11.0, 1, 0.05),
            _whole("plain_torch", 2, 10.0, 1, 2.0),
            _whole("fedtune", 2, 9.5, 2, 0.05),
            _whole("plain_torch", 2, 9.0, 2, 2.0),
            _whole("plain_torch", 16, 40.0, 3, 2.0),
            _whole("fedtune", 16, 12.0, 3, 0.08),
        ]
    }
    report["runs"] += [
        _whole("fedtune_ray", 2, 8.0, 0, 0.05),
        _whole("fedtune_ray", 2, 12.0, 1, 0.1),
    ]
    bench.derive_whole(report)
    goal = report["goal"]
    assert goal["trials"] == 2 and goal["ratio_fedtune_over_plain_torch"] == pytest.approx(0.95)
    assert goal["whole_process_met"] and not goal["half_of_plain_met"]
    assert goal["ratio_fedtune_ray_over_plain_torch"] == pytest.approx(1.0)
    assert goal["ratio_of_interleaved_pairs_median"] == pytest.approx(9.5 / 9.0)
    assert goal["per_trial_overhead_s"] == pytest.approx(0.08) and goal["per_trial_overhead_met"]
    assert report["summary"]["fedtune"]["per_trial_s_slope"] == pytest.approx(2.5 / 14)
    report["runs"][1]["total_s"] = 10.5
    bench.derive_whole(report)
    assert not report["goal"]["whole_process_met"]
