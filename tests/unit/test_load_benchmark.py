"""benchmarks/load.py's summary of its samples: rates, backlog and the CPU each part used."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import load


def _sample(t, recorded, reported, drivers, trials):
    return {
        "t": t,
        "recorded": recorded,
        "reported": reported,
        "in_mlflow": recorded,
        "in_optuna": recorded,
        "driver_cpu_s": drivers,
        "driver_rss_mb": [600.0] * len(drivers),
        "mlflow_cpu_s": {},
        "trial_cpu_s": trials,
        "pg_cpu_s": {},
        "load_1": 2.0,
    }


def test_a_driver_that_ends_before_the_last_sample_keeps_the_cpu_it_used():
    samples = [
        _sample(0.0, 0, 10, [1.0, 2.0], {7: 1.0}),
        _sample(5.0, 500, 520, [2.0, 3.0], {7: 3.0}),
        _sample(10.0, 1000, 1010, [0.0, 4.0], {7: 0.0}),  # driver 0 and trial 7 are gone
    ]
    out = load.summarize(samples)
    assert out["driver_cores"]["each"] == [pytest.approx(0.1), pytest.approx(0.2)]
    assert out["trial_processes_cores"] == pytest.approx(0.2)
    assert out["recorded_rounds_per_s_mean"] == pytest.approx(100.0)
    assert out["reported_rounds_per_s_mean"] == pytest.approx(100.0)


def test_a_driver_never_found_used_no_cpu():
    samples = [_sample(0.0, 0, 0, [0.0], {}), _sample(4.0, 8, 8, [0.0], {})]
    assert load.summarize(samples)["driver_cores"]["each"] == [0.0]
