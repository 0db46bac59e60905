"""benchmarks/pack_layouts.py: every layout computes the same product, and the JSON holds the
rates, both member sums and the pack timed with each."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import pack_layouts

from fedtune.trainers import pack_clients


def test_the_layouts_compared_are_one_product_each():
    """What the benchmark times as one product must be one product: every layout of the
    forward, the weight gradient and the input gradient gives the same values (fp64), and the
    one autograd runs is among them."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 3, dtype=torch.float64, generator=gen)
    d = torch.randn(4, 5, 2, dtype=torch.float64, generator=gen)
    w = torch.randn(4, 2, 3, dtype=torch.float64, generator=gen)
    want = {
        "forward": x @ w.mT,
        "weight_gradient": d.mT @ x,
        "input_gradient": d @ w,
    }
    ways = pack_layouts.layer_ways(x, d, w)
    assert set(ways) == set(want) == set(pack_layouts.AUTOGRAD)
    for kind, fns in ways.items():
        assert pack_layouts.AUTOGRAD[kind] in fns and len(fns) >= 2
        for fn in fns.values():
            torch.testing.assert_close(fn(), want[kind])


@pytest.mark.timeout(300)
def test_the_json_holds_the_rates_the_sums_and_the_pack(tmp_path):
    out = tmp_path / "layouts.json"
    args = ["--seconds", "0.01", "--repeats", "1", "--pack", "2", "--samples", "2"]
    doc = pack_layouts.main([*args, "--rounds", "1", "--threads", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))
    assert set(doc["products"]) == {"64x128", "128x128", "128x10"}
    for kinds in doc["products"].values():
        assert set(kinds) == {"forward", "weight_gradient", "input_gradient"}
        for row in kinds.values():
            assert row["autograd"] in row["gflop_per_s"]
            assert all(r > 0 for r in row["gflop_per_s"].values())
    sums = doc["member_sums_ms"]
    assert sums["reduction"] > 0 and sums["memory_order"] > 0
    pack = doc["pack"]
    assert len(pack["reduction"]["samples"]) == len(pack["memory_order"]["samples"]) == 2
    assert pack["ratio_of_medians"] > 0
    # the plain reduction was put back only for the comparison
    assert pack_clients.member_sums is not pack_layouts.plain_sums
