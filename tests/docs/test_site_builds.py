"""The documentation site builds with warnings as errors (``mkdocs build --strict``)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .pages import REPO

pytestmark = pytest.mark.slow


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        reason = "mkdocs is not installed (pip install -e '.[docs]')"
        print(f"\nSKIP (docs): {reason}")
        pytest.skip(reason)
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={"NO_MKDOCS_2_WARNING": "1", **os.environ},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for page in (
        "index.html",
        "reference/cli/index.html",
        "reference/sdk/index.html",
        "reference/openapi.json",
    ):
        assert (site / page).is_file(), page
    sdk = (site / "reference" / "sdk" / "index.html").read_text()
    assert "submit(spec" in sdk and "StudyDetail" in sdk  # the SDK page's generated reference
