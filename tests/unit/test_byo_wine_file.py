"""The example project's wine task (``examples/byo``) reads scikit-learn's bundled file itself:
the same arrays as ``sklearn.datasets.load_wine``, and no scikit-learn import to read them.

The module is loaded from its file under a name of its own: the example's package ``fedlab``
stays out of this process (``tests/conftest.py``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
from sklearn.datasets import load_wine

WINE_DATA = Path(__file__).resolve().parents[2] / "examples" / "byo" / "fedlab" / "wine_data.py"


def _wine_data() -> ModuleType:
    spec = importlib.util.spec_from_file_location("byo_wine_data", WINE_DATA)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_arrays_are_scikit_learns() -> None:
    data, target = _wine_data().wine_arrays()
    bunch = load_wine()
    assert data.dtype == bunch.data.dtype and target.dtype == bunch.target.dtype
    assert np.array_equal(data, bunch.data) and np.array_equal(target, bunch.target)
    assert data.shape == (178, 13)


def test_reading_them_imports_no_scikit_learn() -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('byo_wine_data', {str(WINE_DATA)!r})\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "data, target = module.wine_arrays()\n"
        "print(data.shape[0], 'sklearn' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split()[-2:] == ["178", "False"], out.stdout + out.stderr


def test_without_the_file_scikit_learns_own_loader_gives_them(monkeypatch) -> None:
    module = _wine_data()
    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: None)
    data, target = module.wine_arrays()
    bunch = load_wine()
    assert np.array_equal(data, bunch.data) and np.array_equal(target, bunch.target)
