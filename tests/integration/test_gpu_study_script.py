"""benchmarks/gpu_study.py's dry run: the GPU path's studies end to end on a logical GPU.

The script a GPU host runs (``benchmarks/gpu_study.sh``) must work before a GPU is lent: here
Ray gets one logical GPU and the trials compute on the CPU. Real Ray, Optuna and MLflow, in a
process of its own (the script starts and stops its Ray, a lean one: ``tests/lean_script.py``).
Four trials per study (``--trials 4``, the script's default is 8): one wave of four at once, the
least that shows four trials sharing the GPU and a pack of four."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.lean_script import command as lean_command

ROOT = Path(__file__).resolve().parents[2]
TRIALS = 4  # per study, all at once


@pytest.mark.timeout(600)
def test_the_gpu_study_runs_four_trials_on_one_gpu_and_packs_by_its_memory(tmp_path):
    out = tmp_path / "gpu_study.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = lean_command("benchmarks/gpu_study.py", "--device", "cpu", "--trials", str(TRIALS))
    proc = subprocess.run(
        [*cmd, "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["problems"] == [] and doc["ray_gpus"] == 1.0
    shared, packed = doc["studies"]["shared"], doc["studies"]["packed"]
    assert shared["most_at_once"] == 4  # 4 × 0.25 of the one GPU
    assert shared["finished"] == packed["finished"] == TRIALS
    assert shared["devices"] == packed["devices"] == ["cpu"]  # every run says where it computed
    assert shared["packing"] == "one configuration per trial process"
    # pack: auto on the one (logical) GPU: 4 concurrent configurations for 1 process slot. The
    # trials compute on the CPU (train.device: cpu), so no GPU memory is measured: as on any CPU,
    # a pack of 4 is measured on the task first and used only where it pays (≥ 2×)
    line = packed["packing"]
    assert "(auto, 1 process slot, a pack of 4 measured " in line, line
    pays = line.endswith("(≥ 2×))")
    expected = "4 configurations per trial process, 1 process" if pays else "one configuration"
    assert line.startswith(expected), line
