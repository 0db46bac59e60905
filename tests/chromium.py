"""Headless Chromium as the tests and the MLflow-UI benchmark start it (Debian's ``chromium``)."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
#: a headless browser that reaches nothing but the pages it is given
HEADLESS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
