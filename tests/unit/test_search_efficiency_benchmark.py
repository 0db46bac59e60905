"""benchmarks/search_efficiency.py on a tiny task: the JSON has what the table of
docs/explanation/search-strategies.md quotes, the grid is computed once and read back from its cache, and a seeded
run repeats itself exactly. Nothing here asserts a timing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks import load_benchmark

REPO = Path(__file__).resolve().parents[2]

TINY = {
    "task": {"name": "quadratic", "clients": 4, "dim": 2, "noise": 0.5, "seed": 0},
    "algorithm": "fedavg",
    "train": {
        "rounds": 12,
        "clients_per_round": 2,
        "local_steps": 2,
        "batch_size": 2,
        "eval_every": 12,
        "dtype": "float64",
    },
    "search": {
        "space": "fedavg",
        "override": {"client_lr": {"grid": [0.01, 0.1]}, "server_lr": {"grid": [0.1, 1.0]}},
    },
}


@pytest.fixture
def bench(tmp_path, monkeypatch):
    module = load_benchmark("search_efficiency.py")
    tasks = sys.modules["search_tasks"]
    monkeypatch.setitem(tasks.TASKS, "tiny", TINY)
    monkeypatch.setattr(tasks, "GRIDS", tmp_path / "grids")
    return module, tasks


def run(module, out: Path, *strategies: str) -> dict:
    args = ["--tasks", "tiny", "--seeds", "0", "1", "--budgets", "1", "2", "--out", str(out)]
    module.main([*args, "--strategies", *strategies])
    return json.loads(out.read_text())


def test_reports_every_strategy_per_budget_and_overall(bench, tmp_path: Path) -> None:
    module, _ = bench
    doc = run(module, tmp_path / "s.json", "tpe", "tpe_guard", "hyperband", "tradeoff")
    task = doc["tasks"]["tiny"]
    assert task["grid"]["points"] == 4 and task["grid"]["best_value"] > 0
    for name in ("tpe", "tpe_guard", "hyperband", "tradeoff"):
        cell = task["search"][name]["by_budget"]["2"]
        assert {
            "median_gap",
            "seeds_within_1pct",
            "seeds_within_5pct",
            "median_trials",
            "median_completed",
            "median_stopped",
            "stop_reasons",
        } <= set(cell)
        assert cell["median_completed"] + cell["median_stopped"] <= cell["median_trials"] + 1
        # a budget counts rounds actually run: each budget B is its own study per seed, run
        # until B x T rounds (or 4 B trials); its last trial is the only one past B x T
        for b in (1, 2):
            for trace in task["traces"][name][str(b)]:
                rounds = [r for r, _, _ in trace]
                assert sum(rounds) >= b * task["rounds"] or len(trace) == 4 * b
                assert sum(rounds[:-1]) < b * task["rounds"]
    assert doc["overall"]["tpe"]["never_worse_than_tpe"] is True
    assert doc["budgets_count"].startswith("rounds actually run")


def test_the_grid_is_cached_and_a_seeded_run_repeats(bench, tmp_path: Path, monkeypatch) -> None:
    module, tasks = bench
    first = run(module, tmp_path / "a.json", "tpe_guard", "hyperband")
    cached = json.loads((tasks.GRIDS / "tiny.json").read_text())
    assert cached["key"] == tasks.digest("tiny") and cached["points"] == 4

    def no_training(*_a, **_k):
        raise AssertionError("the cached grid was recomputed")

    monkeypatch.setattr(tasks, "run_trial", no_training)
    assert tasks.grid_of("tiny")["best_value"] == cached["best_value"]
    monkeypatch.undo()
    monkeypatch.setitem(tasks.TASKS, "tiny", TINY)
    monkeypatch.setattr(tasks, "GRIDS", tmp_path / "grids")
    second = run(module, tmp_path / "b.json", "tpe_guard", "hyperband")
    assert first["tasks"]["tiny"]["traces"] == second["tasks"]["tiny"]["traces"]


def test_importing_the_suite_imports_no_user_code() -> None:
    """The suite's ``byo`` task names ``examples/byo`` (package ``fedlab``): listing the tasks'
    rounds at import must not import it into the process (it leaked into pytest's process and
    broke ``test_user_contract``'s check that the parent never imports user code)."""
    probe = (
        "import sys; sys.path.insert(0, 'benchmarks'); import search_efficiency; "
        "assert search_efficiency.TASKS['byo'][2] == 15; print('fedlab' in sys.modules)"
    )
    run = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"


def test_a_packed_row_at_equal_wall_time_runs_the_rounds_its_speed_up_buys(
    bench, tmp_path: Path
) -> None:
    """``--equal-wall``: a packed row's budget B holds B · T · s rounds (s the task's measured
    speed-up at its P), and its cells are summarized within that budget, not B · T."""
    module, _ = bench
    speed = {"tasks": {"tiny": {"packed": True, "by_size": {"2": {"speedup": 2.5}}}}}
    (tmp_path / "speed.json").write_text(json.dumps(speed))
    args = ["--tasks", "tiny", "--seeds", "0", "--budgets", "1", "2", "--strategies", "tpe"]
    args += ["--pack", "1", "2", "--equal-wall", str(tmp_path / "speed.json")]
    module.main([*args, "--out", str(tmp_path / "w.json")])
    task = json.loads((tmp_path / "w.json").read_text())["tasks"]["tiny"]
    row = task["search"]["tpe+pack2=wall"]
    assert row["wall_scale"] == 2.5 and "wall_scale" not in task["search"]["tpe"]
    for b in (1, 2):
        budget = round(b * 2.5 * task["rounds"])
        (trace,) = task["traces"]["tpe+pack2=wall"][str(b)]
        charged = [r[3] for r in trace]  # a packed row's cost: the rounds its pack ran
        within = next(
            (i for i in range(len(charged)) if sum(charged[: i + 1]) > budget), len(charged)
        )
        assert row["by_budget"][str(b)]["median_trials"] == within
        assert within > task["search"]["tpe"]["by_budget"][str(b)]["median_trials"]
    with pytest.raises(SystemExit, match="no speed-up measured for tiny at P = 4"):
        module.wall_scale(speed, "tiny", 4)
    assert module.wall_scale({"tasks": {"tiny": {"packed": False}}}, "tiny", 4) == 1.0


def test_the_pack_speed_of_a_task_is_measured_on_points_that_complete(bench) -> None:
    speed = load_benchmark("search_pack_speed.py")
    out = speed.measure("tiny", [2], repeats=1)
    size = out["by_size"]["2"]
    assert out["packed"] and size["configurations"] == 2
    assert size["configuration_rounds"] == 2 * out["rounds"]  # a full pack for every round
    assert size["speedup"] == pytest.approx(size["packed_median"] / size["unpacked_median"])
