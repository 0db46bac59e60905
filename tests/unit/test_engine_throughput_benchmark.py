"""benchmarks/engine_throughput.py on its smallest cell: the JSON
the benchmarks page's table (docs/explanation/benchmarks.md) is read from, the goals, the re-scoring and the CUDA mode's structure on a
CPU (its device name is recorded as null there). Nothing here asserts a timing."""

from __future__ import annotations

import json

import pytest
import torch

from tests.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("engine_throughput.py")


def test_one_cell_writes_the_json_and_the_table(bench, tmp_path, capsys):
    out = tmp_path / "e.json"
    doc = bench.main(
        ["--update", "linear/10/1", "--repeats", "1", "--target", "0.001", "--out", str(out)]
    )
    assert list(doc["cells"]) == ["linear/10/1"]
    cell = json.loads(out.read_text())["cells"]["linear/10/1"]
    assert set(cell["rounds_per_s"]) == {
        "vectorized",
        "sequential",
        "plain",
        "fedavg_loop",
        "fedavg_loop_lt",
    }
    assert cell["auto_picks"] in ("vectorized", "sequential")
    assert set(cell["goal_met"]) == {
        "req1_sequential_ge_fedavg_loop",
        "req2_vectorized_ge_plain",
        "req2_auto_ge_plain",
        "req2_met",
        "same_work_sequential_ge_fedavg_loop_lt",
    }
    assert cell["ratios"]["sequential_vs_fedavg_loop_lt"] > 0
    assert len(cell["load_average_1min"]) == 2
    for name in cell.get("profiles", {}):
        assert cell["profiles"][name]["top_by_own_time"]
    assert doc["summary"]["cells"] == 1
    capsys.readouterr()
    bench.main(["--markdown", "--out", str(out)])
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("| model | M | K |") and table[2].startswith("| linear | 10 | 1 |")


def test_rescore_applies_the_current_auto_rule(bench, tmp_path, monkeypatch):
    med = {"vectorized": 1.0, "sequential": 3.0, "plain": 2.0, "fedavg_loop": 2.5}
    cell = {"model": "cnn", "M": 10, "K": 10, "B": 20, "parameters": 50, "rounds_per_s": med}
    out = tmp_path / "e.json"
    out.write_text(json.dumps({"cells": {"cnn/10/10": cell}}))
    doc = bench.main(["--rescore", "--out", str(out)])
    c = doc["cells"]["cnn/10/10"]
    assert c["auto_picks"] == "vectorized" and not c["goal_met"]["req2_met"]
    assert c["goal_met"]["req1_sequential_ge_fedavg_loop"]
    assert doc["summary"]["unmet_req2"] == ["cnn/10/10"]
    monkeypatch.setattr("fedtune.trainers.runners.AUTO_SEQUENTIAL_MIN_PARAMS", 10)
    c = bench.main(["--rescore", "--out", str(out)])["cells"]["cnn/10/10"]
    assert c["auto_picks"] == "sequential" and c["goal_met"]["req2_met"]
    assert c["ratios"]["auto_vs_plain"] == 1.5


def test_cuda_mode_structure_on_cpu(bench):
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA device"):
            bench.main(["--device", "cuda"])
    assert bench.device_name("cpu") is None
    res = bench.run_device("cpu", 2, 1, 1, 0.001, ("cnn",))["cnn"]
    assert set(res["rounds_per_s"]) == {"vectorized", "sequential"}
    assert res["runner_used"] == {"vectorized": "vectorized", "sequential": "sequential"}
    assert res["M"] == 2 and res["parameters"] > 0


def test_resnet_sized_image_task(bench):
    task = bench.image_task(n_clients=3, per_client=2)
    net = task.model_fn(torch.Generator().manual_seed(0))
    assert sum(p.numel() for p in net.parameters()) > 10_000_000
    assert net(task.train.inputs[:2]).shape == (2, 10)


def test_the_same_work_baseline_evaluates_every_client_before_training(bench) -> None:
    """fedavg_loop_lt does the engine's ℓ_t: each cohort client's mean loss on all its data at
    the global weights, before its local steps (the plain fedavg_loop does not)."""
    task = bench.digits_task("linear")
    one_round = bench.fedavg_loop_round(task, 10, 1, lt=True)
    one_round()
    losses = one_round.client_losses
    assert len(losses) == 10 and all(torch.isfinite(v) and v > 0 for v in losses)
    plain = bench.fedavg_loop_round(task, 10, 1)
    plain()
    assert plain.client_losses == []
    fresh = bench.fedavg_loop_round(task, 10, 1, lt=True)
    fresh()
    assert torch.equal(fresh.client_losses[0], losses[0])  # same cohort, same global weights
