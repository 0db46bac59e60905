"""Packed trials on CUDA: each member of a pack on the GPU gives the curve of its own unpacked run
on the GPU (≤ 1e-12 relative in float64), and of its unpacked run on the CPU to within the
rounding of different kernels. Skipped, with the reason, on a machine without CUDA."""

from __future__ import annotations

import pytest
import torch

from fedtune.trainers import Trainer
from fedtune.trainers.packed import PackedTrainer
from tests.unit.test_pack_graph import STEP_CASES, fixed_k, same_records, step_configs
from tests.unit.test_packed_exactness import (
    assert_same_curve,
    digits,
    unpacked,
    variants,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="no CUDA device on this machine (run on a GPU host to exercise packed trials on CUDA)",
)


def on(device: str, configs: list[dict]) -> list[dict]:
    return [{**c, "train": {**c["train"], "device": device}} for c in configs]


def run_pack(configs: list[dict]) -> PackedTrainer:
    pack = PackedTrainer(configs)
    while not pack.done:
        pack.step()
    return pack


@pytest.mark.parametrize("name", ["fedavg", "fedavgm", "fedadam", "fedprox"])
def test_packed_on_cuda_equals_unpacked_on_cuda(name):
    configs = on("cuda", variants(name))
    pack = run_pack(configs)
    assert pack.device.type == "cuda"
    for i, cfg in enumerate(configs):
        single = unpacked(cfg)
        assert pack.result(i).outcome == single.result().outcome
        assert_same_curve(pack.result(i).records, single.records)


def test_digits_mlp_pack_on_cuda_with_local_epochs_and_test_metrics():
    configs = on("cuda", [digits(j, eval_population="full") for j in range(3)])
    pack = run_pack(configs)
    for i, cfg in enumerate(configs):
        assert_same_curve(pack.result(i).records, unpacked(cfg).records)
    assert pack.result(0).records[-1].test


def test_cuda_pack_agrees_with_the_cpu_run():
    """Different kernels round differently: agreement to 1e-9 relative in float64."""
    gpu = run_pack(on("cuda", [digits(j) for j in range(2)]))
    for i, cfg in enumerate(on("cpu", [digits(j) for j in range(2)])):
        cpu = Trainer(cfg)
        while not cpu.done:
            cpu.step()
        for a, b in zip(gpu.result(i).records, cpu.records, strict=True):
            assert a.client_loss == pytest.approx(b.client_loss, rel=1e-9)
            assert a.update_norm == pytest.approx(b.update_norm, rel=1e-9)


def test_the_measured_pack_memory_predicts_a_larger_pack():
    """:func:`fedtune.tuning.packing.memory.measure` (packs of 1 and 4) predicts a pack of 16's
    peak allocation to within a quarter."""
    from fedtune.tuning.packing.memory import measure
    from fedtune.tuning.spec import StudySpec

    base = digits(0)
    study = {
        "name": "memory",
        "task": base["task"],
        "algorithm": "fedavgm",
        "train": base["train"],
        "search": {"space": "fedavgm"},
        "resources": {"gpu": 1},
    }
    spec = StudySpec.from_dict(study)
    memory = measure(spec, 1.0)
    assert memory.per_member > 0 and memory.base >= 0 and memory.available > 0
    config = on("cuda", [digits(0)])[0]
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    pack = PackedTrainer([config] * 16)
    pack.step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    assert abs(peak - memory.need(16)) <= 0.25 * memory.need(16), (peak, memory)


@pytest.mark.parametrize(("name", "steps"), STEP_CASES)
def test_a_graphed_pack_on_cuda_equals_its_eager_twin_and_the_unpacked_runs(name, steps):
    """The local steps replayed as CUDA graphs give the numbers of the same pack run eagerly
    through a divergence (a new shape, a new graph): bit for bit where every pair runs every
    step, and each member's curve is its unpacked run's on the GPU (≤ 1e-12 relative) also
    with a step mask (the graph computes every pair's every step; the eager pack only the
    pairs that have it)."""
    configs = on("cuda", step_configs(name, steps))
    graphed = run_pack(configs)
    eager = PackedTrainer(configs, graphs=False)
    while not eager.done:
        eager.step()
    replayed = graphed.step_graphs
    assert replayed is not None and replayed.failed is None, replayed and replayed.failed
    assert replayed.recorded >= 2
    for i, cfg in enumerate(configs):
        if steps == "equal":
            same_records(graphed.result(i).records, eager.result(i).records)
        assert_same_curve(graphed.result(i).records, unpacked(cfg).records)


def test_a_graphed_digits_mlp_pack_on_cuda_agrees_with_the_cpu_run():
    """The digits MLP in float64 with K fixed, its steps graphed: within 1e-9 of the CPU."""
    configs = fixed_k([digits(j) for j in range(4)])
    gpu = run_pack(on("cuda", configs))
    assert gpu.step_graphs.recorded >= 1 and gpu.step_graphs.failed is None
    cpu = run_pack(on("cpu", configs))
    for i in range(len(configs)):
        for a, b in zip(gpu.result(i).records, cpu.result(i).records, strict=True):
            assert a.client_loss == pytest.approx(b.client_loss, rel=1e-9)
            assert a.update_norm == pytest.approx(b.update_norm, rel=1e-9)
