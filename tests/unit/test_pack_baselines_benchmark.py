"""benchmarks/pack_baselines.py: the hand-written loop trains what a pack trains, and the JSON
holds each way's rate side by side."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pack_baselines


def _pooled_loss(loop: pack_baselines.HandLoop) -> list[float]:
    """Each configuration's mean cross-entropy over every training row."""
    with torch.no_grad():
        return [
            float(loop._loss({k: v[j] for k, v in loop.server.items()}, loop.x, loop.y))
            for j in range(loop.p)
        ]


def test_the_hand_written_loop_trains_every_configuration_on_its_own():
    loop = pack_baselines.HandLoop(3, "cpu")
    before = _pooled_loss(loop)
    assert before[0] == pytest.approx(before[1]) == pytest.approx(before[2])  # one start
    for _ in range(15):
        loop.step()
    after = _pooled_loss(loop)
    # benchmarks/packing.py's rates are small (none may diverge): slow, but every one descends
    assert all(a < b - 1e-3 for a, b in zip(after, before, strict=True)), (before, after)
    assert len({round(a, 6) for a in after}) == 3  # their own γ, η, β: three trajectories


@pytest.mark.timeout(300)
def test_the_json_has_the_pack_and_the_loop_side_by_side(tmp_path):
    out = tmp_path / "baselines.json"
    doc = pack_baselines.main(
        ["--sizes", "2", "--repeats", "1", "--target", "0.05", "--out", str(out)]
    )
    assert json.loads(out.read_text()) == doc
    row = doc["sizes"]["2"]
    assert {"pack", "loop"} <= set(row) and "graph" not in row  # the graph needs CUDA
    assert "pack_eager" not in row and "pack_rows_in_round" not in row  # so do the twins
    assert row["pack"]["median"] > 0 and row["loop"]["median"] > 0
    assert row["pack_over_loop"] == pytest.approx(
        row["pack"]["median"] / row["loop"]["median"], rel=1e-2
    )
    assert doc["flops_per_config_round"] == 6 * (64 * 128 + 128 * 128 + 128 * 10) * 10 * 10 * 16
