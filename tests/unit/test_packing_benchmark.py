"""benchmarks/packing.py's arithmetic ceiling: the MLP's FLOPs per configuration-round and the
speedup bound it gives."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import packing


def test_flops_count_every_weight_of_the_mlp_six_times_per_example():
    weights = 64 * 128 + 128 * 128 + 128 * 10
    assert packing.mlp_flops_per_config_round() == 6 * weights * packing.M * packing.K * packing.B


def test_ceiling_bounds_the_speedup_by_the_measured_product_rate(monkeypatch):
    monkeypatch.setattr(packing, "bmm_gflops", lambda threads: 31.0272)
    c = packing.ceiling(separate_rate=10.0)
    assert c["config_rounds_per_s_at_bmm_rate"] == pytest.approx(100.0)
    assert c["max_speedup_vs_separate"] == pytest.approx(10.0)
    assert c["separate_gflops"] == pytest.approx(3.1, abs=0.01)


def test_the_product_rate_is_measured():
    assert packing.bmm_gflops(threads=1, p=1, seconds=0.05) > 0.1


@pytest.mark.timeout(300)
def test_stagger_times_a_pack_at_one_round_index_and_at_several(tmp_path):
    out = tmp_path / "staggered.json"
    args = ["--stagger", "4", "--sizes", "4", "--tasks", "quadratic", "--repeats", "1"]
    args += ["--chunk", "2"]  # two vmapped calls of 2 members each
    doc = packing.main([*args, "--target", "0.2", "--out", str(out)])
    (row,) = doc["results"]["quadratic"]
    assert row["one_round_index"]["round_indices"] == 1
    assert row["staggered"]["round_indices"] == 4  # joined one step apart, as refills join
    assert row["ratio"] == pytest.approx(
        row["staggered"]["config_rounds_per_s"] / row["one_round_index"]["config_rounds_per_s"],
        abs=1e-3,
    )
    assert out.exists() and doc["setting"]["stagger"] == 4 and doc["setting"]["chunk"] == 2
    for side in ("one_round_index", "staggered"):
        assert row[side]["minor_faults_per_round"] >= 0


@pytest.mark.timeout(300)
def test_the_pack_profile_splits_a_round_into_its_phases(tmp_path):
    import pack_profile

    out = tmp_path / "profile.json"
    args = ["--tasks", "quadratic", "--sizes", "1,3", "--rounds", "2", "--repeats", "2"]
    doc = pack_profile.main([*args, "--profiled", "2", "--out", str(out)])
    rows = doc["results"]["quadratic"]
    assert [r["P"] for r in rows] == [1, 3] and out.exists()
    for row in rows:
        assert len(row["samples_ms_per_round"]) == 2
        assert row["ms_per_round"] == pytest.approx(statistics.median(row["samples_ms_per_round"]))
        shares = row["share_of_step"]
        assert set(shares) == set(pack_profile.PHASES)
        # the phases run inside step; a round's rows were drawn during the round before
        # (_ahead), so _batches is inside _ahead, not _open
        assert 0 < shares["_batches"] <= shares["_ahead"] < 1 and row["rows_drawn_ahead"] == 1.0
        assert 0 < shares["_open"] < 1 and 0 < shares["_close"] < 1
        assert 0 < shares["_local_steps"] < 1
        phases = ("_open", "_local_steps", "_ahead", "_close")
        assert sum(shares[p] for p in phases) <= 1.001
        assert row["kernel_launches"] == 0 and "device_busy_ms" not in row  # a CPU run
        assert row["graph_launches"] == 0 and row["graphs_recorded"] == 0
        assert 0 < row["batches_ms"] < 2 * row["ms_per_round"]  # a part of a round (timed apart)
        ops = row["operators"]  # the quadratic's products are batched matrix products too
        assert ops["bmm_ms"] > 0 and ops["bmm_gflop_per_s"] > 0 and ops["other_ms"] > 0
        top = ops["top_ms"]
        assert len(top) <= 8 and list(top.values()) == sorted(top.values(), reverse=True)
        if "bmm" in top:
            assert top["bmm"] == ops["bmm_ms"]
        else:  # on a loaded machine a preempted operator can outlast the products
            assert len(top) == 8 and ops["bmm_ms"] <= min(top.values())
