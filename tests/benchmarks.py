"""Load a script of ``benchmarks/`` as a module (they are scripts, not a package)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(filename: str) -> ModuleType:
    """``benchmarks/<filename>`` imported under its own name with a ``_bench`` suffix."""
    path = BENCHMARKS / filename
    spec = importlib.util.spec_from_file_location(f"{path.stem}_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
