"""benchmarks/mlflow_ui_scale.py, smoke: a tiny synthetic study, its parent
run's artifacts, a real ``mlflow server`` and headless Chromium on the runs page, the JSON.
The sizes at 10/100/1,000 trials and the load times are the benchmark's, not asserted here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.benchmarks import load_benchmark
from tests.needs import need


def test_the_benchmark_writes_sizes_and_the_runs_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = load_benchmark("mlflow_ui_scale.py")
    need(
        "chromium",
        None
        if bench.CHROMIUM.is_file()
        else f"{bench.CHROMIUM} is not installed (apt-get install chromium)",
    )
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "ui.json"
    assert (
        bench.main(
            [
                "--sizes",
                "4",
                "--real-max",
                "0",
                "--ui-repeats",
                "1",
                "--workdir",
                str(tmp_path / "w"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    (size,) = report["sizes"]
    assert size["how"] == "synthetic" and size["finished"] == 4
    assert size["trials_table_rows"] == 4 == size["tradeoff_trials_total"]
    assert {
        "trials_table.json",
        "best.json",
        "tradeoff/tradeoff.json",
        "tradeoff/pareto.png",
        "tradeoff/curves.png",
    } <= set(size["artifact_bytes"])
    every = size["listing_every_trial_bytes"]
    assert every["tradeoff.json_every_trial"] == every["tradeoff.json_bounded"]  # 4 <= 50
    ui = size["ui"]
    assert ui["runs_page"]["runs_shown"] and ui["runs_page_by_name"]["runs_shown"]
    assert ui["runs_page"]["load_s_median"] > 0 and ui["runs_search_api_s_median"] > 0
    assert report["environment"]["load_average_1_5_15"]
