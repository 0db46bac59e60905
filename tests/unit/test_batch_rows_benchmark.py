"""benchmarks/batch_rows.py: both ways draw the same rows, and the JSON holds their times."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import batch_rows


def test_both_ways_draw_the_same_rows_and_the_json_holds_their_times(tmp_path):
    counts = torch.tensor([50, 120, 400, 77, 301, 64, 90, 55, 250, 399])
    offsets = torch.cumsum(counts, 0) - counts
    clients = torch.arange(10) * 3
    for t in range(3):
        a = batch_rows.per_stream([0, 5, 9], t, clients, offsets, counts)
        b = batch_rows.vectorised([0, 5, 9], t, clients, offsets, counts)
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
        assert a[0].shape == (10, batch_rows.K, batch_rows.B)
        assert not torch.equal(a[0], a[1])  # each configuration its own stream
    out = tmp_path / "rows.json"
    doc = batch_rows.main(["--sizes", "1,3", "--repeats", "2", "--rounds", "1", "--out", str(out)])
    assert json.loads(out.read_text()) == doc
    for row in doc["results"].values():
        for way in ("per_stream", "vectorised"):
            assert len(row[way]["samples"]) == 2 and row[way]["ms_per_round"] > 0
        assert row["speedup"] > 0
