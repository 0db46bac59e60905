"""Processes the tests started, read from ``/proc``: whether one still runs, and waiting until a
group of them has exited."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["live_name", "wait_gone"]


def live_name(pid: int) -> str | None:
    """Give ``pid``'s command name while it runs.

    Args:
        pid: The process.

    Returns:
        Its command name, or None once it has exited (gone, or a zombie not yet reaped).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name, _, rest = stat.partition(" (")[2].rpartition(") ")
    return None if rest.startswith(("Z", "X")) else name


def wait_gone(pids: Sequence[int], timeout_s: float) -> list[int]:
    """Poll until every process of ``pids`` has exited or ``timeout_s`` has passed.

    Args:
        pids: The processes.
        timeout_s: The most seconds to wait.

    Returns:
        Those still running.
    """
    deadline = time.monotonic() + timeout_s
    alive = [p for p in pids if live_name(p) is not None]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if live_name(p) is not None]
    return alive
