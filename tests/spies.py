"""Call counters for tests: a function replaced by one that records each call, then calls it."""

from __future__ import annotations

from typing import Any

import pytest


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Replace ``owner.name`` (for the test) by a wrapper that appends 1 per call.

    Args:
        monkeypatch: The test's monkeypatch (the original comes back after the test).
        owner: The module or class that holds the function.
        name: The function's attribute name.

    Returns:
        The list the wrapper appends to: its length is the number of calls.
    """
    calls: list[int] = []
    inner = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return inner(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls
