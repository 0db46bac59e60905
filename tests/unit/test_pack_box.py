"""The packed study's ``PackBox``: stops and refills from the driver to the packs.

Its methods run here on an asyncio loop, as Ray's asyncio actor runs them; the benchmark runs
it as a real Ray actor, in a process of its own.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from fedtune.tuning.packing.box import PackBox
from tests.benchmarks import BENCHMARKS


def test_a_poll_names_the_stopped_live_members_and_takes_the_offers_once() -> None:
    async def scenario() -> list:
        box = PackBox()
        await box.stop([3, 9])
        await box.offer("pack-0001", [{"n": 5}])
        await box.offer("pack-0002", [{"n": 6}])
        first = await box.poll("pack-0001", [1, 3, 4])
        again = await box.poll("pack-0001", [1, 4])
        return [first, again, await box.poll("pack-0002", [])]

    first, again, other = asyncio.run(scenario())
    assert first == ([3], [{"n": 5}])  # 9 is not this pack's
    assert again == ([], [])  # an offer is taken once
    assert other == ([], [{"n": 6}])  # each pack takes its own


def test_an_answer_comes_only_once_the_driver_answered_that_report() -> None:
    async def scenario() -> list:
        box = PackBox()
        await box.offer("p", [], answers=4)  # the answer to an earlier report
        waiting = asyncio.create_task(box.answer("p", 7, [1, 2]))
        await asyncio.sleep(0.05)
        early = waiting.done()
        await box.offer("p", [{"n": 8}])  # an offer that answers no report yet
        await box.stop([2])
        await asyncio.sleep(0.05)
        still = waiting.done()
        await box.offer("p", [{"n": 9}], answers=7)
        return [early, still, await asyncio.wait_for(waiting, 5), await box.answer("p", 7, [1])]

    early, still, got, after = asyncio.run(scenario())
    assert not early and not still
    assert got == ([2], [{"n": 8}, {"n": 9}])  # the stops and every offer up to the answer
    assert after == ([], [])  # answered, nothing left: a pack with no member would end


def test_the_box_imports_no_torch() -> None:
    code = "import sys, fedtune.tuning.packing.box; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.timeout(300)
def test_the_benchmark_measures_a_real_actor(tmp_path) -> None:
    out = tmp_path / "box.json"
    script = BENCHMARKS / "pack_box.py"  # its own process: its own Ray session
    args = ["--sessions", "1", "--calls", "5", "--out", str(out)]
    subprocess.run([sys.executable, str(script), *args], check=True, capture_output=True)
    result = json.loads(out.read_text())
    session = result["sessions"][0]
    assert session["rss_mb"] > 0 and session["poll_ms"] > 0 and session["answer_ready_ms"] > 0
    assert result["torch_imported"] is False
    assert result["median"]["rss_mb"] == session["rss_mb"]
