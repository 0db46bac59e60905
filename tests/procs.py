"""Processes the tests started, read from ``/proc``: whether one still runs, and waiting until a
group of them has exited."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["dying", "live_name", "signals", "wait_gone", "wait_not_dying"]

#: ``PF_EXITING`` of a thread's flags (``/proc/<pid>/task/<tid>/stat``, field 9): in ``do_exit``
PF_EXITING = 0x4


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


def dying(pid: int) -> bool:
    """Whether ``pid`` is being ended: one of its threads has SIGKILL pending or is exiting.

    A process killed (a SIGKILL, or ``PR_SET_PDEATHSIG``'s when its parent died) shows this
    from the moment the signal is sent until it is a zombie; a zombie, or a process gone, is
    not dying.

    Args:
        pid: The process.

    Returns:
        True while the kernel is ending it.
    """
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        fields = stat.rpartition(") ")[2].split()
        if fields[0] in ("Z", "X"):
            continue
        if int(fields[6]) & PF_EXITING:
            return True
        if signal.SIGKILL in signals(status, "SigPnd", "ShdPnd"):
            return True
    return False


def signals(status: str, *fields: str) -> set[int]:
    """The signal numbers in masks of a ``/proc/<pid>[/task/<tid>]/status`` text.

    Args:
        status: The file's text.
        fields: The masks to join (``SigPnd``, ``ShdPnd``: pending; ``SigBlk``: blocked).

    Returns:
        Every signal set in any of them.
    """
    mask = 0
    for line in status.splitlines():
        name, _, value = line.partition(":")
        if name in fields:
            mask |= int(value, 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


def wait_not_dying(pids: Sequence[int], timeout_s: float, every_s: float = 0.05) -> list[int]:
    """Poll until none of ``pids`` is :func:`dying` on two looks in a row, or ``timeout_s``.

    Two looks ``every_s`` apart: a thread that has just taken its SIGKILL and not yet set
    ``PF_EXITING`` (a few instructions of the kernel's) shows neither on one look.

    Args:
        pids: The processes.
        timeout_s: The most seconds to wait.
        every_s: Seconds between looks.

    Returns:
        Those still dying at the end (empty once they all have died or are not being killed).
    """
    deadline = time.monotonic() + timeout_s
    calm = 0
    while True:
        still = [p for p in pids if dying(p)]
        calm = 0 if still else calm + 1
        if calm >= 2 or time.monotonic() >= deadline:
            return still
        time.sleep(every_s)
