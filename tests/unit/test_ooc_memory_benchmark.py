"""benchmarks/ooc_memory.py on a tiny population: it generates
Stack Overflow-shaped TFF HDF5 files, measures each population in a fresh subprocess and writes
the JSON the table of docs/explanation/benchmarks.md is read from."""

from __future__ import annotations

import json
import subprocess
import sys

import h5py
import pytest

from tests.benchmarks import BENCHMARKS, load_benchmark

BENCH = BENCHMARKS / "ooc_memory.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("ooc_memory.py")


def test_generated_file_has_the_loader_layout_and_is_reused(bench, tmp_path):
    path = tmp_path / "so.h5"
    first = bench.generate(path, 30, posts_max=4)
    assert first["reused"] is False and first["posts"] >= 30
    with h5py.File(path, "r") as f:
        clients = sorted(f["examples"])
        assert clients == [f"{i:08d}" for i in range(30)]
        sizes = [f["examples"][c]["tokens"].shape[0] for c in clients]
        assert sum(sizes) == first["posts"] and min(sizes) >= 1 and max(sizes) <= 4
        post = f["examples"][clients[0]]["tokens"][0].decode()
        assert post.split() and all(w.startswith("w") for w in post.split())
    again = bench.generate(path, 30, posts_max=4)
    assert again == {"reused": True, "bytes": first["bytes"], "posts": first["posts"]}
    assert bench.generate(path, 31, posts_max=4)["reused"] is False  # another recipe: rewritten


def _bench(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_script_writes_per_population_rss_and_reads_only_the_cohort(tmp_path):
    """Two invocations, the second ``--append``-ing a population to the first's JSON (how the
    documented numbers were collected); one whose settings differ is refused."""
    out = tmp_path / "ooc.json"
    common = [
        "--rounds",
        "2",
        "--clients-per-round",
        "5",
        "--in-memory-max",
        "40",
        "--posts-max",
        "4",
        "--workdir",
        str(tmp_path / "files"),
        "--out",
        str(out),
    ]
    done = _bench("--populations", "40", *common)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "wrote" in done.stdout
    done = _bench("--populations", "120", "--append", *common)
    assert done.returncode == 0, done.stderr[-2000:]
    refused = _bench("--populations", "120", "--append", *common, "--vocab", "50", timeout=120)
    assert refused.returncode == 2 and "settings differ" in refused.stderr
    assert "vocab" in refused.stderr
    report = json.loads(out.read_text())
    assert report["benchmark"] == "ooc_memory" and report["environment"]
    assert report["settings"]["populations"] == [40, 120]
    assert report["settings"]["posts_max"] == 4
    assert set(report["files"]) == {"40", "120"}
    assert set(report["lazy"]) == {"40", "120"} and set(report["in_memory"]) == {"40"}
    for population, summary in report["lazy"].items():
        assert summary["clients"] == int(population)
        assert summary["examples"] == report["files"][population]["posts"]
        assert summary["median_clients_read_per_round"] == 5  # the cohort, not the population
        for key in (
            "median_round_peak_rss_mib",
            "max_round_peak_rss_mib",
            "median_load_peak_rss_mib",
            "median_process_peak_rss_mib",
        ):
            assert 10 < summary[key] < 100_000, key
        (run,) = summary["runs"]
        assert [r["round"] for r in run["rounds"]] == [1, 2]
        assert [r["population_eval"] for r in run["rounds"]] == [True, False]
        assert all(r["peak_rss_mib"] >= r["rss_after_mib"] > 0 for r in run["rounds"])
    assert report["in_memory"]["40"]["median_clients_read_per_round"] == 0  # nothing lazy
    assert report["environment"]["earlier"]["python"]  # the first run's machine is kept


def test_rounds_below_two_are_refused():
    done = _bench("--rounds", "1", "--populations", "10", timeout=120)
    assert done.returncode == 2 and "--rounds" in done.stderr
