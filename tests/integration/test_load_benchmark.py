"""benchmarks/load.py: one tiny real run (one study of two configurations, one worker node,
SQLite stores behind a real ``mlflow server`` of one worker), unpacked then packed two to a
process, and the figures derived from samples. Nothing here asserts a timing or a rate."""

from __future__ import annotations

import json

import pytest

from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("load.py")


def test_a_tiny_run_records_every_round_it_received_packed_or_not(bench, tmp_path) -> None:
    out = tmp_path / "load.json"
    bench.main(
        [
            "--backend",
            "sqlite",
            "--ladder",
            "2",
            "--pack",
            "1",
            "2",
            "--studies",
            "1",
            "--nodes",
            "1",
            "--gpus-per-node",
            "1",
            "--window",
            "2",
            "--no-profile",
            "--mlflow-workers",
            "1",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert report["environment"]["load_average_1_5_15"] and report["environment"]["versions"]
    unpacked, packed = report["steps"]
    assert (unpacked["pack"], unpacked["processes"]) == (1, 2)
    assert (packed["pack"], packed["processes"]) == (2, 1)  # two configurations, one process
    for step in (unpacked, packed):
        assert step["concurrent"] == 2 and step["studies"] == 1
        assert not step["driver_errors"]
        after = step["after_interrupt"]
        # every round received is in MLflow once, compared per configuration (each its own
        # run and trial); the tracking callback runs before the counter, so a SIGINT between
        # the two leaves at most one report (one round here) per configuration stored but
        # not counted
        assert after["received"] > 0 and after["lost"] == 0 and after["duplicated"] == 0
        assert 0 <= after["stored_not_counted"] <= step["concurrent"]
        # Optuna, which Tune gives a result before its callbacks, may hold one round more than
        # was counted per configuration, for the same reason; otherwise it trails
        assert 0 <= after["optuna_ahead_not_counted"] <= step["concurrent"]
        assert 0 <= after["optuna_last_steps_behind"] < after["received"]
        assert step["trial_processes"]["count"] >= 1 and step["driver_rss_mb"]["max"] > 0
    assert set(report["projection"]) == {"pack1", "pack2"}
    assert set(report["projection"]["pack2"]) >= {
        "slope_rounds_per_s_per_trial",
        "driver_cores_for_500_rounds_per_s",
    }


def test_packed_studies_count_configurations(bench) -> None:
    assert bench.split(64, 8) == [8] * 8 and bench.split(3, 8) == [1, 1, 1]
    assert bench.processes([8] * 8, 8) == 8 and bench.processes([8] * 8, 1) == 64
    assert bench.processes([5, 3], 4) == 3  # ceil(5 / 4) + one pack of 3
    spec = bench.study_spec("s", 3, 10, pack=8)
    assert spec["resources"]["pack"] == 3 and spec["budget"]["max_concurrent"] == 3
    assert "pack" not in bench.study_spec("s", 3, 10)["resources"]


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


def test_a_driver_gone_before_the_last_sample_keeps_the_cpu_it_used(bench) -> None:
    samples = [_sample(t, 100 * t, 100 * t, 0.5 * t) for t in range(11)]
    samples[-1] = {**samples[-1], "driver_cpu_s": [0.0, 10.0]}  # driver 0 ended: read as 0.0
    assert bench.summarize(samples)["driver_cores"]["each"] == [0.45, 1.0]


def test_profile_areas(bench) -> None:
    raw = "\n".join(
        [
            "thread (MainThread);run (study.py:1);_find_and_load (<frozen>:1) 5",
            "thread (MainThread);step (ray/tune/execution/tune_controller.py:1);"
            "on_trial_result (fedtune/tuning/optuna/searcher.py:2);report (optuna/trial/_trial.py:3) 3",
            "thread (fedtune-mlflow-rounds);_run (fedtune/tuning/mlflow/round_log.py:1);"
            "log_batch (mlflow/tracking/client.py:9) 2",
        ]
    )
    p = bench.profile(raw)
    assert p["samples"] == 10 and p["startup_share"] == 0.5
    assert p["share_by_area_after_startup"] == {
        "Optuna storage writes": 0.6,
        "MLflow flusher thread (log_batch)": 0.4,
    }


def test_trial_profile_parts(bench, tmp_path) -> None:
    source = tmp_path / "pack_trial.py"
    source.write_text(
        "def _train_pack(config, spec, box):\n"
        "    stepped = runs.step()\n"
        "    stopped, offered = poll.answer(pack.live)\n"
        "    tune.report({ROUND: t, MEMBERS: reports})\n"
        "    offered = poll.wait(t)\n"
    )

    def at(line: int) -> str:
        return f"_train_pack ({source}:{line})"

    raw = "\n".join(
        [
            f"thread (train);run (ray/tune/f.py:1);{at(2)};step (fedtune/trainers/packed.py:9) 5",
            f"thread (train);{at(3)};answer ({source}:9);get (ray/_private/worker.py:1) 2",
            f"thread (train);{at(4)};report (ray/tune/session.py:1) 3",
            "thread (main);run (ray/_private/worker.py:1) 7",  # not the training thread
        ]
    )
    p = bench.trial_profile(raw)
    assert p["training_thread_samples"] == 10
    assert p["share_by_part"] == {
        "engine round (PackedTrainer / Trainer)": 0.5,
        "tune.report (hand-off to the driver)": 0.3,
        "PackBox: ray.get of the driver's stops and refills": 0.2,
    }
    assert p["share_by_line"][0] == ["stepped = runs.step()", 0.5]
    assert bench.trial_profile("")["share_by_part"] == {}
