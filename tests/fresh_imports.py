"""What a fresh interpreter imports: the tests that keep a process's start-up light (a CLI
command, a driver, a trial) ask it here, one spelling for all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

__all__ = ["imported_after"]

REPO = Path(__file__).resolve().parents[1]


def imported_after(*codes: str, full: bool = False) -> list[set[str]]:
    """Modules a fresh interpreter has loaded after running each of ``codes`` in turn (one
    interpreter: a snapshot of ``sys.modules`` after each).

    Args:
        *codes: Python code, run one after the other.
        full: Whole module names (default: their top-level packages only).

    Returns:
        One set of names per code.
    """
    names = "sys.modules" if full else "{m.split('.')[0] for m in sys.modules}"
    snap = f"import json, sys\nprint(json.dumps(sorted({names})))"
    probe = "\n".join(f"{code}\n{snap}" for code in codes)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    lines = out.stdout.strip().splitlines()[-len(codes) :]
    return [set(json.loads(line)) for line in lines]
