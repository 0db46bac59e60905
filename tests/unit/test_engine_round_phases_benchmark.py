"""benchmarks/engine_round_phases.py on a few rounds: every phase is timed inside its round, the
engine's functions are put back afterwards, and the JSON has what docs/explanation/benchmarks.md
quotes. Nothing here asserts a timing."""

from __future__ import annotations

import json
from pathlib import Path

from fedtune.trainers import engine, runners
from tests.benchmarks import load_benchmark


def test_phases_lie_inside_the_round_and_the_engine_is_restored(tmp_path: Path) -> None:
    bench = load_benchmark("engine_round_phases.py")
    before = (engine.Trainer._cohort, engine.cohort_rows, runners.VectorizedRunner.map)
    out = tmp_path / "phases.json"
    few = {"--models": "linear", "--rounds": "4", "--samples": "2", "--warmup": "1"}
    doc = bench.main([*(a for kv in few.items() for a in kv), "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))
    cell = doc["cells"]["linear/10/1"]
    for runner in ("vectorized", "sequential"):
        phases = cell[runner]["phases_us"]
        assert {"cohort", "cohort_draw", "batch_rows", "lt_eval", "local_steps"} <= set(phases)
        assert phases["cohort_draw"] + phases["batch_rows"] <= phases["cohort"]
        inner = phases["cohort"] + phases["lt_eval"] + phases["local_steps"]
        assert 0 < inner <= cell[runner]["round_us"]
    assert cell["plain"]["min_round_us"] <= cell["plain"]["round_us"]
    assert (engine.Trainer._cohort, engine.cohort_rows, runners.VectorizedRunner.map) == before
