"""benchmarks/light_install.py measures a venv and writes the JSON the docs quote; here on the
development venv (``--venv``, no build: the build is tests/service/test_light_install.py's,
marked slow), where the heavy distributions are present and the check must say so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.benchmarks import load_benchmark


def test_writes_the_json_and_sees_the_heavy_distributions(tmp_path: Path) -> None:
    out = tmp_path / "light_install.json"
    doc = load_benchmark("light_install.py").main(
        ["--repeats", "1", "--venv", sys.prefix, "--out", str(out)]
    )
    assert json.loads(out.read_text()) == doc
    assert set(doc) == {"benchmark", "environment", "settings", "goal", "results"}
    assert doc["goal"] == {"installed_mb": 25.0, "startup_s": 0.3}
    results = doc["results"]
    assert results["heavy_absent"] is False  # torch, Ray, ... are in the development venv
    assert results["installed_mb"] > 25 and results["goal_met"] is False
    assert results["distributions"]["torch"]["mb"] > 100
    assert (
        set(results["median_s"])
        == set(results["median_cpu_s"])
        == {
            "python_pass",
            "import_fedtune_client",
            "fedtune_Client",
            "fedtune_version",
            "fedtune_help",
        }
    )
    assert doc["settings"]["pip_install_s"] is None  # measured, not built
