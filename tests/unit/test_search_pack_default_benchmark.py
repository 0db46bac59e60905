"""benchmarks/search_pack_default.py and benchmarks/pack_probe.py: the default's row per task
follows the probe, and the goals of the search suite are counted from the rows' gaps. Made-up
rows, nothing trained; nothing here asserts a timing."""

from __future__ import annotations

from tests.benchmarks import load_benchmark

PACKED = "tpe_guard+pack8=wall"


def _row(*gaps_by_budget: list[float]) -> dict:
    return {
        "by_budget": {
            str(b): {"gaps": gaps, "median_trials": 10}
            for b, gaps in zip((16, 32), gaps_by_budget, strict=True)
        }
    }


def test_the_default_row_is_the_packed_one_only_where_the_probe_packs():
    module = load_benchmark("search_pack_default.py")
    wall = {
        "budgets": [16, 32],
        "tasks": {
            # packs: at 16 better than TPE, at 32 worse in seeds (4 against 5)
            "cheap": {
                "search": {
                    "tpe": _row([0.05] * 5, [0.0] * 5),
                    "tpe_guard": _row([0.5] * 5, [0.5] * 5),
                    PACKED: _row([0.0] * 5, [0.0, 0.0, 0.0, 0.0, 0.02]),
                }
            },
            # does not pay: its unpacked tpe_guard row, never its packed one
            "costly": {
                "search": {
                    "tpe": _row([0.1] * 5, [0.1] * 5),
                    "tpe_guard": _row([0.0, 0.2, 0.0, 0.0, 0.0], [0.0] * 5),
                    PACKED: _row([9.0] * 5, [9.0] * 5),
                }
            },
            "refused": {
                "search": {
                    "tpe": _row([0.0] * 5, [0.0] * 5),
                    "tpe_guard": _row([0.0] * 5, [0.0] * 5),
                }
            },
        },
    }
    probe = {
        "tasks": {
            "cheap": {"median_speedup": 3.0},
            "costly": {"median_speedup": 1.99},
            "refused": {"refusal": "its own aggregator"},
        }
    }
    got = module.score(wall, probe, pays=2.0)
    rows = {task: t["row"] for task, t in got["tasks"].items()}
    assert rows == {"cheap": PACKED, "costly": "tpe_guard", "refused": "tpe_guard"}
    assert got["tasks"]["cheap"]["by_budget"]["16"]["never_worse"]
    assert not got["tasks"]["cheap"]["by_budget"]["32"]["never_worse"]  # 4 seeds against 5
    goals = got["goals"]
    assert goals["16"]["cells_never_worse"] == 3 and goals["32"]["cells_never_worse"] == 2
    # seeds 0-2 within 1 %: cheap 3, costly 2 (seed 1 is 20 % off), refused 3
    assert goals["16"]["first3_runs_within_1pct"] == 8 and goals["16"]["first3_runs"] == 9
    assert goals["16"]["tasks_with_4_of_5"] == 3 and goals["32"]["tasks_with_4_of_5"] == 3
    assert (
        goals["32"]["all_runs_within_1pct"] == 14 and goals["32"]["tpe_all_runs_within_1pct"] == 10
    )
    assert module.packs(probe, "missing", 2.0) is None


def test_the_probe_report_compares_with_the_full_measurement_at_the_same_size():
    module = load_benchmark("pack_probe.py")
    report = {"tasks": {"t": {"by_size": {"8": {"speedup": 1.5}}}}}
    assert module.full_speedup(report, "t", 8) == 1.5
    assert module.full_speedup(report, "t", 4) is None
    assert module.full_speedup(None, "t", 8) is None
