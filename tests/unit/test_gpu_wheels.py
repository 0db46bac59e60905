"""tools/gpu_wheels.py: wheels laid out in carry groups under a size, a wheel larger than a
group cut into parts, and put back together byte for byte (or refused with one line)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import gpu_wheels


def _wheels(tmp_path: Path) -> dict[str, bytes]:
    sizes = {"ray-2.60.0-cp312-none.whl": 2500, "mlflow-3.17.2-py3-none-any.whl": 700}
    sizes |= {"optuna-5.0.0-py3-none-any.whl": 300, "cmaes-0.12-py3-none-any.whl": 100}
    out = {}
    for name, size in sizes.items():
        out[name] = os.urandom(size)
        (tmp_path / "raw").mkdir(exist_ok=True)
        (tmp_path / "raw" / name).write_bytes(out[name])
    return out


def test_groups_stay_under_their_size_and_assemble_byte_for_byte(tmp_path):
    wheels = _wheels(tmp_path)
    laid = tmp_path / "whl"
    manifest = gpu_wheels.lay_out(sorted((tmp_path / "raw").glob("*.whl")), laid, 1000)
    groups = sorted(p for p in laid.iterdir() if p.is_dir())
    assert [g.name for g in groups] == ["g1", "g2", "g3", "g4"]
    for group in groups:
        assert sum(f.stat().st_size for f in group.iterdir()) <= 1000
    ray_parts = manifest["wheels"]["ray-2.60.0-cp312-none.whl"]["parts"]
    assert ray_parts == [f"g{i}/ray-2.60.0-cp312-none.whl.part-{i - 1:02d}" for i in (1, 2, 3)]
    assert json.loads((laid / gpu_wheels.MANIFEST).read_text()) == manifest
    built = gpu_wheels.assemble(laid, tmp_path / "out")
    assert {w.name: w.read_bytes() for w in built} == wheels


def test_a_missing_or_damaged_part_is_refused_with_one_line(tmp_path):
    _wheels(tmp_path)
    laid = tmp_path / "whl"
    gpu_wheels.lay_out(sorted((tmp_path / "raw").glob("*.whl")), laid, 1000)
    part = laid / "g2" / "ray-2.60.0-cp312-none.whl.part-01"
    data = part.read_bytes()
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(SystemExit, match=r"ray-2\.60\.0-cp312-none\.whl: SHA-256 differs"):
        gpu_wheels.assemble(laid, tmp_path / "out")
    part.unlink()
    with pytest.raises(SystemExit, match=r"missing g2/ray-2\.60\.0-cp312-none\.whl\.part-01"):
        gpu_wheels.assemble(laid, tmp_path / "out")


def test_wheel_names_give_their_projects():
    assert gpu_wheels.project("scikit_learn-1.9.1-cp312-cp312-manylinux.whl") == "scikit-learn"
    assert gpu_wheels.project("PyYAML-6.0.4-cp312.whl") == "pyyaml"
    assert "numpy" in gpu_wheels.ON_THE_IMAGE and "ray" not in gpu_wheels.ON_THE_IMAGE
