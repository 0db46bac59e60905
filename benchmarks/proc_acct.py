"""The processes a sampler misses, from the kernel's process accounting (``accton``, Debian's
``acct``): one record per process that exits, however short it lived.

``benchmarks/proc_census.py sample --acct FILE`` turns accounting on for the run. A process
shorter than the census's sampling interval (a ``python -c`` probe, a CLI call, a code check) is
in no sample; here it is, with its parent, its start and its CPU, and :func:`unseen` charges it to
a test: through its parents to a sampled process that names its test, or to the test that ran on
the pytest worker that started it (``FEDTUNE_TEST_TIMELINE``, which records each worker's pid).
"""

from __future__ import annotations

import struct
import subprocess
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path

__all__ = ["file_at", "lifetimes", "read", "start", "stop", "unseen", "worker_runs"]

#: ``struct acct_v3`` of ``<linux/acct.h>``: flag, version, tty, exit code, uid, gid, pid, ppid,
#: start (epoch s), elapsed (ticks, float), then eight ``comp_t`` (utime, stime, mem, io, rw,
#: minflt, majflt, swaps) and the command name
_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_AHZ = 100  # the ticks of acct's times (AHZ)


def start(path: Path) -> None:
    """Turn process accounting on, into a new ``path`` (root only).

    Raises:
        RuntimeError: ``accton`` is missing or refused.
    """
    path.write_bytes(b"")
    try:
        subprocess.run(["accton", str(path)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise RuntimeError(f"process accounting did not start (accton {path}): {exc}") from None


def stop() -> None:
    """Turn process accounting off."""
    subprocess.run(["accton", "off"], check=False, capture_output=True)


def _comp(value: int) -> float:
    """A ``comp_t`` (13-bit mantissa, 3-bit base-8 exponent) as a number of ticks."""
    return float((value & 0x1FFF) << (3 * ((value >> 13) & 7)))


def read(path: Path) -> list[dict]:
    """The exited processes that used CPU, from an accounting file.

    Args:
        path: What ``accton`` wrote.

    Returns:
        One ``{"pid", "ppid", "start_at" (epoch s), "elapsed_s", "cpu_s", "comm"}`` per process.
    """
    data = path.read_bytes()
    out = []
    for offset in range(0, len(data) - _V3.size + 1, _V3.size):
        rec = _V3.unpack_from(data, offset)
        if rec[1] != 3:  # not a v3 record
            continue
        cpu = (_comp(rec[10]) + _comp(rec[11])) / _AHZ
        if cpu <= 0:
            continue
        out.append(
            {
                "pid": rec[6],
                "ppid": rec[7],
                "start_at": float(rec[8]),
                "elapsed_s": rec[9] / _AHZ,
                "cpu_s": round(cpu, 2),
                "comm": rec[18].rstrip(b"\0").decode(errors="replace"),
            }
        )
    return out


def _by_pid(items: list[dict]) -> dict[int, list[dict]]:
    table: dict[int, list[dict]] = defaultdict(list)
    for item in items:
        table[item["pid"]].append(item)
    for entries in table.values():
        entries.sort(key=lambda e: e["start_at"])
    return table


def _at(table: dict[int, list[dict]], pid: int, when: float) -> dict | None:
    """The process ``pid`` that had started by ``when`` (the latest such; pids are reused)."""
    entries = table.get(pid, [])
    i = bisect_right([e["start_at"] for e in entries], when + 1.0)
    return entries[i - 1] if i else None


def _match(seen: dict[int, list[dict]], rec: dict) -> dict | None:
    """The sampled process that ``rec`` is the exit of, if any (the same pid, started within
    two seconds: acct's start has one-second steps)."""
    match = _at(seen, rec["pid"], rec["start_at"])
    if match is not None and abs(match["start_at"] - rec["start_at"]) <= 2.0:
        return match
    return None


def lifetimes(exited: list[dict], sampled: list[dict]) -> dict[tuple[int, int], float]:
    """The whole CPU of each sampled process that exited during the run.

    A sample sees a process's CPU up to its last sample; what it used after (up to an interval)
    is in its exit record. A process older than the run keeps only its CPU since the run began.

    Args:
        exited: :func:`read`'s records.
        sampled: The census's processes (``pid``, ``start``, ``start_at``, ``cpu_s``,
            ``cpu0_s``).

    Returns:
        ``{(pid, start ticks): CPU-seconds}`` for the sampled processes that have an exit record.
    """
    if not exited:
        return {}
    seen = _by_pid(sampled)
    out = {}
    for rec in exited:
        match = _match(seen, rec)
        if match is not None:
            whole = rec["cpu_s"] - match.get("cpu0_s", 0.0)
            out[(match["pid"], match["start"])] = max(match["cpu_s"], round(whole, 2))
    return out


def worker_runs(tests: list[dict]) -> dict[int, list[dict]]:
    """``FEDTUNE_TEST_TIMELINE``'s lines by the pid of the pytest worker that ran them.

    Args:
        tests: The timeline's lines (``test``, ``pid``, ``start``, ``end``); older lines
            without ``pid`` are left out.

    Returns:
        ``{worker pid: [line, ...]}``.
    """
    runs: dict[int, list[dict]] = defaultdict(list)
    for t in tests:
        if "pid" in t:
            runs[t["pid"]].append(t)
    return runs


def file_at(runs: dict[int, list[dict]], pid: int, when: float) -> str | None:
    """The file of the test that pytest worker ``pid`` ran at ``when`` (within a second).

    Args:
        runs: :func:`worker_runs`' result.
        pid: A pytest worker's pid.
        when: A process's start (epoch seconds).

    Returns:
        The test file, or None: no test then.
    """
    test = next((t for t in runs.get(pid, []) if t["start"] - 1 <= when <= t["end"] + 1), None)
    return test["test"].split("::", 1)[0] if test else None


def unseen(exited: list[dict], sampled: list[dict], tests: list[dict]) -> list[tuple[dict, str]]:
    """The exited processes that no sample saw, each with the test file it is charged to.

    Args:
        exited: :func:`read`'s records.
        sampled: The census's processes (``pid``, ``ppid``, ``start_at``, ``test``).
        tests: ``FEDTUNE_TEST_TIMELINE``'s lines (``test``, ``pid``, ``start``, ``end``).

    Returns:
        ``(record, file)`` pairs; ``file`` is ``-`` when no ancestor names a test.
    """
    if not exited:  # no accounting (or a census written before it had ``start_at``)
        return []
    seen = _by_pid(sampled)
    gone = _by_pid(exited)
    runs = worker_runs(tests)
    out = []
    for rec in exited:
        if _match(seen, rec) is not None:
            continue  # sampled: the census has it (its tail: :func:`lifetimes`)
        file, pid, when = "-", rec["ppid"], rec["start_at"]
        for _ in range(50):
            if pid in runs:  # a pytest worker: the test it ran then
                file = file_at(runs, pid, when) or "-"
                break
            parent = _at(seen, pid, when)
            if parent is not None and parent.get("test"):
                file = parent["test"].split("::", 1)[0]
                break
            parent = parent or _at(gone, pid, when)
            if parent is None:
                break
            pid = parent["ppid"]
        out.append((rec, file))
    return out
