"""benchmarks/suite_idle.py: a run's idle CPU charged to the tests running when it was idle."""

from __future__ import annotations

from tests.benchmarks import load_benchmark


def test_idle_cpu_is_split_among_the_tests_running_then() -> None:
    bench = load_benchmark("suite_idle.py")
    raw = {
        "wall_s": 30.0,
        "started_at": 1000.0,
        # [seconds since the start, busy CPU-s, idle CPU-s] since the previous sample
        "timeline": [[10.0, 19.0, 1.0], [20.0, 12.0, 8.0], [30.0, 20.0, 0.0]],
    }
    tests = [  # a waits from 1005 to 1020, b runs beside it from 1012 to 1030
        {"test": "tests/e2e/test_a.py::waits", "worker": "gw0", "start": 1005.0, "end": 1020.0},
        {"test": "tests/unit/test_b.py::runs", "worker": "gw1", "start": 1012.0, "end": 1030.0},
    ]
    out = bench.idle_by_test(raw, tests, top=5)
    assert out["cpu_busy_s"] == 51.0 and out["cpu_idle_s"] == 9.0
    assert out["busy_share"] == 0.85
    assert out["idle_by_test"] == {
        "tests/e2e/test_a.py::waits": 5.0,  # the first second alone, half of the next eight
        "tests/unit/test_b.py::runs": 4.0,
    }
    assert out["idle_by_file"]["tests/e2e/test_a.py"] == 5.0
    assert out["by_tests_running"] == {
        "1": {"wall_s": 20.0, "idle_cpu_s": 1.0},  # a alone, then b alone
        "2": {"wall_s": 10.0, "idle_cpu_s": 8.0},
    }
