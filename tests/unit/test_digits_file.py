"""The digits task reads scikit-learn's bundled file itself: the same arrays as
``sklearn.datasets.load_digits``, and no scikit-learn import in the process that builds it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from fedtune.trainers.tasks import digits
from fedtune.trainers.tasks.digits import load_digits


def sklearn_load_digits():
    """scikit-learn's own loader, imported when called: importing ``sklearn.datasets`` costs a
    process about 1 CPU-s, which collecting this module would make every test run pay."""
    from sklearn.datasets import load_digits as loader

    return loader()


def test_the_arrays_are_scikit_learns() -> None:
    data, target = load_digits()
    bunch = sklearn_load_digits()
    assert data.dtype == bunch.data.dtype and target.dtype == bunch.target.dtype
    assert np.array_equal(data, bunch.data) and np.array_equal(target, bunch.target)
    assert data.shape == (1797, 64)


def test_building_the_task_imports_no_scikit_learn() -> None:
    code = (
        "import sys\n"
        "from fedtune.trainers.tasks.registry import build_task\n"
        "task = build_task('digits', {'clients': 5, 'model': 'linear'}, 0)\n"
        "print(task.name, 'sklearn' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split()[-2:] == ["digits", "False"], out.stdout + out.stderr


def test_without_the_file_scikit_learns_own_loader_gives_them(monkeypatch) -> None:
    monkeypatch.setattr(digits.importlib.util, "find_spec", lambda name: None)
    data, target = load_digits()
    bunch = sklearn_load_digits()
    assert np.array_equal(data, bunch.data) and np.array_equal(target, bunch.target)
