"""benchmarks/load.py: one tiny real run (one study, one trial, one worker
node, SQLite stores behind a real ``mlflow server``) and the figures derived from samples.
Nothing here asserts a timing or a rate."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("load.py")


def test_a_tiny_run_records_every_round_it_received(bench, tmp_path) -> None:
    out = tmp_path / "load.json"
    bench.main(
        [
            "--backend",
            "sqlite",
            "--ladder",
            "1",
            "--studies",
            "1",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--window",
            "2",
            "--no-profile",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert report["environment"]["load_average_1_5_15"] and report["environment"]["versions"]
    (step,) = report["steps"]
    assert step["concurrent"] == 1 and step["studies"] == 1
    after = step["after_interrupt"]
    assert after["received"] > 0 and after["lost"] == 0  # every round is in MLflow
    assert 0 <= after["optuna_last_steps_behind"] < after["received"]
    assert step["trial_processes"]["count"] >= 1 and step["driver_rss_mb"]["max"] > 0
    assert set(report["projection"]) >= {
        "slope_rounds_per_s_per_trial",
        "driver_cores_for_500_rounds_per_s",
    }


def _sample(t: float, reported: int, recorded: int, cpu: float) -> dict:
    return {
        "t": t,
        "reported": reported,
        "recorded": recorded,
        "driver_cpu_s": [cpu, 2 * cpu],
        "driver_rss_mb": [100.0, 120.0],
        "mlflow_cpu_s": {1: cpu, **({2: t} if t > 5 else {})},
        "pg_cpu_s": {},
        "load_1": 1.0,
    }


def test_summary_rates_backlog_slope_and_projection(bench) -> None:
    samples = [_sample(t, 100 * t + 10 * t, 100 * t, 0.5 * t) for t in range(11)]
    s = bench.summarize(samples)
    assert s["recorded_rounds_per_s_mean"] == 100 and s["recorded_rounds_per_s_median"] == 100
    assert s["backlog_rounds"]["slope_per_s"] == 10  # a growing backlog shows as its slope
    assert s["driver_cores"]["each"] == [0.5, 1.0] and s["driver_rss_mb"]["max"] == 120
    assert s["mlflow_server_cores"] == 0.9  # 0.5/s of pid 1, 4 s of pid 2 (came at t=6)
    gone = [*samples[:-1], {**samples[-1], "mlflow_cpu_s": {1: 0.0, 2: 0.0}}]  # both ended
    assert bench.summarize(gone)["mlflow_server_cores"] == 0.75  # last readings: 4.5 + 3 s
    steps = [
        {**s, "concurrent": 8},
        {**bench.summarize([_sample(t, 200 * t, 200 * t, t) for t in range(11)]), "concurrent": 16},
    ]
    p = bench.projection(steps)
    assert p["slope_rounds_per_s_per_trial"] == pytest.approx(12.5)
    assert p["driver_cpu_ms_per_recorded_round"] == [15.0, 15.0]
    assert p["driver_cores_for_500_rounds_per_s"] == 7.5


def test_profile_areas(bench) -> None:
    raw = "\n".join(
        [
            "thread (MainThread);run (study.py:1);_find_and_load (<frozen>:1) 5",
            "thread (MainThread);step (ray/tune/execution/tune_controller.py:1);"
            "on_trial_result (fedtune/tuning/optuna_glue.py:2);report (optuna/trial/_trial.py:3) 3",
            "thread (fedtune-mlflow-rounds);_run (fedtune/tuning/round_log.py:1);"
            "log_batch (mlflow/tracking/client.py:9) 2",
        ]
    )
    p = bench.profile(raw)
    assert p["samples"] == 10 and p["startup_share"] == 0.5
    assert p["share_by_area_after_startup"] == {
        "Optuna storage writes": 0.6,
        "MLflow flusher thread (log_batch)": 0.4,
    }
