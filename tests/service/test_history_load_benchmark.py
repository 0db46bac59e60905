"""Smoke test of ``benchmarks/history_load.py`` (and ``seed_history.py``) with tiny numbers: the
seeded schema is served by a real ``fedtune serve``, every scenario answers without error at
the requested rate, the tick table has each level, and the JSON holds machine and versions.
The full run (10,000 studies, 1,000,000 trials) is not part of the suite."""

from __future__ import annotations

import json

from tests.benchmarks import load_benchmark


def test_history_load_smoke(pg_available, tmp_path) -> None:
    bench = load_benchmark("history_load.py")
    out = tmp_path / "history.json"
    argv = [
        "--studies",
        "120",
        "--trials",
        "1200",
        "--rate",
        "20",
        "--duration",
        "0.5",
        "--tick-levels",
        "0",
        "6",
        "--tick-repeats",
        "2",
        "--output",
        str(out),
    ]
    assert bench.main(argv) == 0, out.read_text()[-2000:]
    report = json.loads(out.read_text())
    assert report["seed"]["studies"] == 120 and report["seed"]["trials"] == 1200
    assert set(report["endpoints"]) == {
        "list_first",
        "list_deep_token",
        "list_deep_offset",
        "list_filtered",
        "list_asc",
        "get_study",
    }
    for name, result in report["endpoints"].items():
        assert result["requests"] == 10 and result["errors"] == 0, (name, result)
        assert 0 < result["p50_ms"] <= result["p99_ms"] <= result["max_ms"]
    assert [t["finished_studies"] for t in report["tick"].values()] == [0, 6]
    assert all(
        t["median_ms"] > 0 and t["statements_per_tick"] > 0 and t["pages_read_per_tick"] > 0
        for t in report["tick"].values()
    )
    env = report["environment"]
    assert env["machine"] and env["load_average_1_5_15"] and env["versions"]["postgresql_server"]
