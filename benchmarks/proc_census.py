"""Where a test run's CPU goes, process by process, sampled from ``/proc``:
``python benchmarks/proc_census.py sample --out RAW.json -- make test`` runs the command and
samples every process on the machine each ``--interval`` seconds; ``python
benchmarks/proc_census.py report RAW.json`` sums the samples per test file and per kind of
process.

Each process is known by its pid and start time; its CPU is the last sample's user + system
time (all its threads), so a process shorter than one interval is missed and one that lives on
after its last sample loses at most an interval. A process is charged to the test that was
current when it started: with the timeline (``report --tests``), the test its pytest worker
ancestor ran then; else ``PYTEST_CURRENT_TEST`` in its (or its nearest ancestor's) environment at
exec, which for a child of a session's server names the test that started the server.
pytest's own workers run the in-process tests, which the JUnit times of
``benchmarks/suite_dirs.py`` already give; this census shows the rest: study drivers, Ray's
processes, servers, PostgreSQL, browsers, image builds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import proc_acct
from _env import environment

from fedtune.service.backends.local import stat_fields

TICK = os.sysconf("SC_CLK_TCK")
#: the machine's boot (epoch seconds): a process's start ticks count from it
BOOT = next(
    float(line.split()[1])
    for line in Path("/proc/stat").read_text().splitlines()
    if line.startswith("btime ")
)


def _stat(pid: str) -> tuple[int, float, int] | None:
    """``(ppid, cpu seconds, start ticks)`` of ``pid``, or None once it is gone."""
    fields = stat_fields(int(pid))
    if fields is None:
        return None
    # item n - 3 is proc(5)'s field n: ppid 4, utime 14, stime 15, starttime 22
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[19])


def _busy_idle() -> tuple[float, float]:
    """The machine's busy and idle CPU-seconds since boot, summed over cores (``/proc/stat``)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / TICK, idle / TICK


def _first_seen(pid: str) -> tuple[str, list[str], str]:
    """The command name, command line and ``PYTEST_CURRENT_TEST`` a process started with."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "", [], ""
    try:  # a process's environment can be unreadable: its name and command line still count
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        env = []
    prefix = b"PYTEST_CURRENT_TEST="
    test = next(
        (e[len(prefix) :].decode(errors="replace") for e in env if e.startswith(prefix)), ""
    )
    return comm, [a.decode(errors="replace")[-160:] for a in argv[:6] if a], test


def sample(command: list[str], interval: float, out: Path, acct: Path | None = None) -> dict:
    """Run ``command`` and sample every process until it ends, writing ``out`` each minute.

    Args:
        command: The command and its arguments.
        interval: Seconds between two samples.
        out: Where the partial result is written each minute (the caller writes the last).
        acct: Turn the kernel's process accounting on into this file for the run (root), so
            that processes shorter than an interval are counted too (``exited``).

    Returns:
        ``{"processes": [...], "command": ..., "wall_s": ..., "timeline": [...]}``: one entry
        per process seen, and per sample ``[seconds since the start, busy CPU-s, idle CPU-s]``
        of the whole machine since the previous sample; with ``acct``, ``exited``: every
        process that exited during the run (:func:`proc_acct.read`).
    """
    me = str(os.getpid())
    seen: dict[tuple[str, int], dict] = {}
    if acct is not None:
        proc_acct.start(acct)
    started, epoch = time.monotonic(), time.time()
    try:  # accounting is machine-wide: it is turned off however the run ends
        child = subprocess.Popen(command)
        first, written = True, time.monotonic()
        timeline: list[list[float]] = []
        last_busy, last_idle = _busy_idle()

        def result() -> dict:
            return {
                "command": command,
                "returncode": child.returncode,
                "wall_s": round(time.monotonic() - started, 1),
                "started_at": round(epoch, 2),
                "interval_s": interval,
                "processes": list(seen.values()),
                "timeline": timeline,
            }

        while True:
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid == me:
                    continue
                st = _stat(pid)
                if st is None:
                    continue
                ppid, cpu, ticks = st
                entry = seen.get((pid, ticks))
                if entry is None:
                    comm, argv, test = _first_seen(pid)
                    entry = seen[(pid, ticks)] = {
                        "pid": int(pid),
                        "ppid": ppid,
                        "start": ticks,
                        "start_at": round(BOOT + ticks / TICK, 2),
                        "comm": comm,
                        "argv": argv,
                        "test": test,
                        "cpu_s": 0.0,
                        # a process older than the run: only its CPU from now on counts
                        "cpu0_s": cpu if first and int(pid) != child.pid else 0.0,
                    }
                entry["cpu_s"] = cpu - entry["cpu0_s"]
            first = False
            busy, idle = _busy_idle()
            timeline.append(
                [
                    round(time.monotonic() - started, 1),
                    round(busy - last_busy, 2),
                    round(idle - last_idle, 2),
                ]
            )
            last_busy, last_idle = busy, idle
            if child.poll() is not None:
                break
            if time.monotonic() - written > 60:  # a partial result survives the sampler's end
                out.write_text(json.dumps(result()))
                written = time.monotonic()
            time.sleep(interval)
    finally:
        if acct is not None:
            proc_acct.stop()
    final = result()
    if acct is not None:
        final["exited"] = proc_acct.read(acct)
    return final


def kind_of(proc: dict) -> str:
    """A short name for what a process was, from its command line."""
    argv = proc.get("argv") or []
    head = " ".join(argv)
    # pytest itself is its program (``pytest``, ``python -m pytest``), not any command whose
    # arguments name a folder of pytest's (``/tmp/pytest-of-root/…``: a test's own processes)
    if any(Path(a).name in ("pytest", "py.test") for a in argv[:3]):
        return "pytest"
    for key, name in (
        ("xdist", "pytest worker"),
        ("exec(eval(sys.stdin.readline()))", "pytest worker"),  # execnet's bootstrap
        ("default_worker.py", "ray worker"),
        # Ray's agents rename themselves a second or more after they start: a sample after that
        # sees only their new title (``ray::…``, as a worker's), not their script
        ("ray::DashboardAgent", "ray dashboard"),
        ("ray::RuntimeEnvAgent", "ray runtime_env agent"),
        ("raylet", "raylet"),
        ("gcs_server", "ray gcs"),
        ("dashboard", "ray dashboard"),
        ("ray/autoscaler", "ray monitor"),
        ("log_monitor", "ray log monitor"),
        ("runtime_env", "ray runtime_env agent"),
        ("ray/_private", "ray helper"),
        ("bin/ray", "ray cli"),
        ("uvicorn", "uvicorn"),
        ("gunicorn", "gunicorn"),
        ("mlflow", "mlflow"),
        ("fedtune", "fedtune"),
        ("postgres", "postgres"),
        ("chrom", "chromium"),
        ("nginx", "nginx"),
        ("buildah", "buildah"),
        ("bwrap", "bwrap"),
        ("benchmarks/", "benchmark script"),
    ):
        if key in head:
            return name
    if proc.get("comm", "").startswith("ray::"):
        return "ray worker"
    return proc.get("comm") or "?"


def _charged(processes: list[dict], tests: list[dict] | None = None) -> dict[tuple[int, int], str]:
    """The test file of each process (by pid and start), or ``-``.

    A process that descends from a pytest worker is charged to the test that worker ran when
    the process started (the timeline's ``tests``): a session's Ray or MLflow server carries in
    its environment the test that started it, and so does every child it starts later, for
    whichever test. A pytest worker's own child is charged to the test in its environment, when
    it has one: exact, where its start (``btime`` counts whole seconds) may also match the end of
    the test before. Other processes: their own ``PYTEST_CURRENT_TEST``, else their nearest
    ancestor's.

    Args:
        processes: The census's processes.
        tests: ``FEDTUNE_TEST_TIMELINE``'s lines (``test``, ``pid``, ``start``, ``end``).

    Returns:
        ``{(pid, start): file}``.
    """
    by_pid = {p["pid"]: p for p in processes}  # the latest process of each pid
    runs = proc_acct.worker_runs(tests or [])

    def ancestors(p: dict) -> Iterator[dict]:
        q = p
        for _ in range(50):
            parent = by_pid.get(q["ppid"])
            if parent is None or parent["start"] > q["start"]:  # a later process, same pid
                return
            yield parent
            q = parent

    def by_timeline(p: dict) -> str | None:
        when = p.get("start_at")
        if when is None:
            return None
        for q in ancestors(p):
            if q["pid"] in runs:  # a pytest worker: the test it ran then
                if q["pid"] == p["ppid"] and p["test"]:
                    # its own child: the test in its environment is the one that started it,
                    # where its start (whole seconds of btime) may match the test before too
                    return p["test"].split("::", 1)[0]
                return proc_acct.file_at(runs, q["pid"], when)
        return None

    def by_environment(p: dict) -> str:
        q = next((a for a in (p, *ancestors(p)) if a["test"]), None)
        return q["test"].split("::", 1)[0] if q else "-"

    return {(p["pid"], p["start"]): by_timeline(p) or by_environment(p) for p in processes}


def report(raw: dict, top: int, tests: list[dict] | None = None) -> dict:
    """The samples summed per kind, per test file and per (file, kind).

    Args:
        raw: What :func:`sample` returned.
        top: Rows kept per table.
        tests: ``FEDTUNE_TEST_TIMELINE``'s lines: charges a short process that a pytest worker
            started to the test it was running (else such a process is charged to ``-``).

    Returns:
        The sums: CPU-seconds in all, in pytest's processes and outside them, in processes no
        sample saw (``exited`` only: their kind is their command name, marked ``(short)``), and
        the tables. With ``exited``, a sampled process that exited counts its whole CPU (its
        exit record's), not only its CPU up to its last sample.
    """
    # charged over every process, CPU or not: a sandbox's bwrap uses none of its own
    files = _charged(raw["processes"], tests)
    # a process's CPU after its last sample is in its exit record, when accounting was on
    whole = proc_acct.lifetimes(raw.get("exited", []), raw["processes"])
    rows = [
        (whole.get((p["pid"], p["start"]), p["cpu_s"]), kind_of(p), files[(p["pid"], p["start"])])
        for p in raw["processes"]
        if whole.get((p["pid"], p["start"]), p["cpu_s"]) > 0
    ]
    short = [
        (rec["cpu_s"], f"{rec['comm']} (short)", file)
        for rec, file in proc_acct.unseen(raw.get("exited", []), raw["processes"], tests or [])
    ]
    rows += short
    outside = [r for r in rows if r[1] not in ("pytest worker", "pytest")]

    def table(key) -> dict:
        out: dict[str, list] = defaultdict(lambda: [0, 0.0])
        for cpu, kind, file in outside:
            entry = out[key(kind, file)]
            entry[0] += 1
            entry[1] += cpu
        ranked = sorted(out.items(), key=lambda kv: -kv[1][1])[:top]
        return {k: {"processes": n, "cpu_s": round(s, 1)} for k, (n, s) in ranked}

    cpu_all, cpu_outside = sum(r[0] for r in rows), sum(r[0] for r in outside)
    inside = _worker_tests(tests or [], top)
    return {
        "wall_s": raw["wall_s"],
        "processes": len(rows),
        "cpu_s_all": round(cpu_all, 1),
        "cpu_s_pytest": round(cpu_all - cpu_outside, 1),
        "cpu_s_outside_pytest": round(cpu_outside, 1),
        "cpu_s_short": round(sum(r[0] for r in short), 1),
        "kinds": table(lambda kind, file: kind),
        "test_files": table(lambda kind, file: file),
        "file_and_kind": table(lambda kind, file: f"{file} | {kind}"),
        **inside,
    }


def _worker_tests(tests: list[dict], top: int) -> dict:
    """The CPU pytest's own processes spent in each test file and test (the timeline's
    ``cpu_s``: a worker's CPU from a test's setup to its teardown), most first.

    Args:
        tests: ``FEDTUNE_TEST_TIMELINE``'s lines; lines without ``cpu_s`` (older timelines)
            are left out, and with none the result is empty.
        top: Rows kept per table.

    Returns:
        ``{"pytest_cpu_s_in_tests": ..., "pytest_test_files": {file: cpu_s},
        "pytest_tests": {test: cpu_s}}``, or ``{}``.
    """
    timed = [t for t in tests if "cpu_s" in t]
    if not timed:
        return {}
    files: dict[str, float] = defaultdict(float)
    for t in timed:
        files[t["test"].split("::", 1)[0]] += t["cpu_s"]

    def ranked(pairs) -> dict[str, float]:
        return {k: round(v, 1) for k, v in sorted(pairs, key=lambda kv: -kv[1])[:top]}

    return {
        "pytest_cpu_s_in_tests": round(sum(t["cpu_s"] for t in timed), 1),
        "pytest_test_files": ranked(files.items()),
        "pytest_tests": ranked((t["test"], t["cpu_s"]) for t in timed),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("sample", help="run a command and sample /proc until it ends")
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--interval", type=float, default=1.0)
    s.add_argument("--acct", type=Path, help="process accounting into this file (root)")
    s.add_argument("command", nargs=argparse.REMAINDER)
    r = sub.add_parser("report", help="sum a sample's processes")
    r.add_argument("raw", type=Path)
    r.add_argument("--top", type=int, default=30)
    r.add_argument("--tests", type=Path, help="FEDTUNE_TEST_TIMELINE's file")
    r.add_argument("--note", default="")
    r.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.mode == "sample":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        raw = sample(command, args.interval, args.out, args.acct)
        args.out.write_text(json.dumps(raw))
        sys.exit(raw["returncode"])
    tests = read_tests(args.tests) if args.tests else None
    emit(report(json.loads(args.raw.read_text()), args.top, tests), args.note, args.out)


def read_tests(path: Path) -> list[dict]:
    """The lines of a ``FEDTUNE_TEST_TIMELINE`` file (one test's start, end and worker each)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def emit(body: dict, note: str, out: Path | None) -> None:
    """Print a report with the machine's environment and ``note`` first, and write it to ``out``
    when given."""
    text = json.dumps({"environment": environment(), "note": note, **body}, indent=1)
    if out:
        out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
