"""Fixtures the unit tests of where a study's trials run share."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Ray cluster named and none running in this process (else every study goes through it)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        pytest.skip("Ray runs in this process: every study goes through it")
