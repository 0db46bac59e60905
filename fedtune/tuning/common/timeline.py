"""Start-up timeline of a study: time stamps of the driver's and the trials' phases.

Off unless the environment variable :data:`ENV` names a file: then :func:`mark` appends one
JSON line ``{"phase": name, "t": time.time(), "pid": os.getpid()}`` per call (``O_APPEND``
writes of one short line: the driver and its trial processes, which inherit the variable
through embedded Ray, share the file). ``benchmarks/startup.py`` reads it to split a study's
fixed cost into phases (imports, Ray start, Optuna storage, MLflow, first trial scheduling,
the trial process's start and imports). Without the variable a mark costs one dict lookup.
"""

from __future__ import annotations

import json
import os
import time

from .. import env

__all__ = ["ENV", "enabled", "mark", "process_start"]

#: the variable naming the timeline file (read by :func:`fedtune.tuning.env.timeline_file`)
ENV = "FEDTUNE_TIMELINE"


def enabled() -> bool:
    """A timeline file is set (compute what only the timeline needs only then)."""
    return env.timeline_file() is not None


def mark(phase: str, t: float | None = None) -> None:
    """Append ``phase`` at ``t`` (default: now) to the timeline file, if one is set."""
    path = env.timeline_file()
    if not path:
        return
    line = json.dumps({"phase": phase, "t": time.time() if t is None else t, "pid": os.getpid()})
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def process_start() -> float | None:
    """When this process started (seconds since the epoch), from ``/proc``; None elsewhere."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
