"""``benchmarks/refill_lag.py``: a pack's Tune results give each refill's lag, the rounds
between the end of the member whose place it took and its own start."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.benchmarks import BENCHMARKS, load_benchmark


def _member(number: int, rounds: range, outcome: str = "running") -> dict:
    return {
        "fedtune.trial": number,
        "outcome": outcome,
        "history": [{"round": r} for r in rounds],
    }


def test_each_refill_takes_the_oldest_freed_place() -> None:
    bench = load_benchmark("refill_lag.py")
    results = [
        {"round": 1, "members": [_member(0, range(1, 2)), _member(1, range(1, 2))]},
        # 1 diverged at step 2 (no row); 0 goes on
        {"round": 2, "members": [_member(1, range(0), "diverged"), _member(0, range(2, 3))]},
        {"round": 3, "members": [_member(0, range(3, 4))]},  # 1's place not refilled yet
        # 7 joined after step 3 (its round 1 ran at step 4): one round late
        {"round": 4, "members": [_member(0, range(4, 5)), _member(7, range(1, 2))]},
        # 0 was stopped at step 4 (its last report); 8 joined after step 4: no lag
        {"round": 6, "members": [_member(7, range(2, 4)), _member(8, range(1, 3))]},
    ]
    assert bench.lags(results) == [1, 0]
    assert bench.lags(results[:3]) == []  # nothing joined after the first members


@pytest.mark.timeout(600)
def test_the_benchmark_measures_the_refills_of_a_real_packed_study(tmp_path) -> None:
    out = tmp_path / "lag.json"
    script = BENCHMARKS / "refill_lag.py"  # its own process: its own Ray
    args = ["--pack", "3", "--trials", "6", "--rounds", "8", "--out", str(out)]
    subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True)
    doc = json.loads(out.read_text())
    assert doc["finished"] == 6 and doc["packs"] >= 1
    assert doc["refills"] >= 1  # the places ASHA and the first ends freed were refilled
    assert 0 <= doc["lag_rounds"]["median"] <= doc["lag_rounds"]["max"]
    assert sum(doc["lag_rounds"]["histogram"].values()) == doc["refills"]
