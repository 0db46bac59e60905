"""benchmarks/proc_census.py: every process a command starts, its CPU charged to the test that
started it (the test its pytest worker ran then, from the timeline; else its own
``PYTEST_CURRENT_TEST``, else its nearest ancestor's)."""

from __future__ import annotations

import sys

from tests.benchmarks import load_benchmark

#: a "test" that starts a child which burns CPU, and a grandchild whose environment is cleared
#: (as a sandbox clears it): both are charged to the test through their ancestry. Each idles a
#: second after its spin, so that a sample sees its whole CPU however late the sampler wakes.
SPIN = (
    "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"
    "time.sleep(1.0)\n"
)
CHILD = (
    "import os, subprocess, sys\n"
    + SPIN.format(s=0.6)
    + "subprocess.run([sys.executable, '-c', {grand!r}], env={{'PATH': os.environ['PATH']}})\n"
)


def test_a_childs_cpu_is_charged_to_the_test_that_started_it(tmp_path) -> None:
    bench = load_benchmark("proc_census.py")
    grand = SPIN.format(s=0.8)
    code = CHILD.format(grand=grand)
    command = [
        "env",
        "PYTEST_CURRENT_TEST=tests/unit/test_x.py::test_y (call)",
        sys.executable,
        "-c",
        code,
    ]
    raw = bench.sample(command, 0.1, tmp_path / "raw.json")
    assert raw["returncode"] == 0
    report = bench.report(raw, top=10)
    charged = report["test_files"]["tests/unit/test_x.py"]
    assert charged["processes"] >= 2  # the child and the grandchild with no variable of its own
    assert charged["cpu_s"] >= 1.4  # 0.6 + 0.8 s spun
    assert report["cpu_s_outside_pytest"] >= charged["cpu_s"]


def test_kinds_come_from_the_command_line() -> None:
    bench = load_benchmark("proc_census.py")
    worker = {"argv": ["python", "-u", "-c", "import sys;exec(eval(sys.stdin.readline()))"]}
    assert bench.kind_of(worker) == "pytest worker"
    ray = {"argv": ["python", "/x/ray/_private/workers/default_worker.py"], "comm": "ray::IDLE"}
    assert bench.kind_of(ray) == "ray worker"
    # Ray's agents, seen after they renamed themselves (their comm as a worker's: ``ray::…``)
    agent = {"argv": ["ray::DashboardAgent"], "comm": "ray::DashboardA"}
    assert bench.kind_of(agent) == "ray dashboard"
    env_agent = {"argv": ["ray::RuntimeEnvAgent"], "comm": "ray::RuntimeEn"}
    assert bench.kind_of(env_agent) == "ray runtime_env agent"
    assert bench.kind_of({"argv": ["/v/bin/fedtune", "tune", "s.yaml"]}) == "fedtune"
    # a test's process is not pytest's because its arguments lie in pytest's folders
    in_tmp = {"argv": ["/v/bin/fedtune", "tune", "/tmp/pytest-of-root/pytest-3/t0/s.yaml"]}
    assert bench.kind_of(in_tmp) == "fedtune"
    assert bench.kind_of({"argv": ["/v/bin/python", "-m", "pytest", "-n", "2"]}) == "pytest"
    assert bench.kind_of({"argv": ["/v/bin/python", "/v/bin/pytest", "tests"]}) == "pytest"
    assert bench.kind_of({"argv": [], "comm": "kworker"}) == "kworker"


def test_a_process_whose_environment_is_unreadable_keeps_its_name_and_command_line(
    monkeypatch,
) -> None:
    """Only the test is lost with the environment: the kind still comes from the command."""
    import os
    from pathlib import Path

    bench = load_benchmark("proc_census.py")
    read_bytes = Path.read_bytes

    def no_environ(path: Path) -> bytes:
        if path.name == "environ":
            raise PermissionError(13, "Permission denied", str(path))
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", no_environ)
    comm, argv, test = bench._first_seen(str(os.getpid()))
    assert comm == Path(f"/proc/{os.getpid()}/comm").read_text().strip()
    assert argv and test == ""
    assert bench.kind_of({"comm": comm, "argv": argv}) != "?"


def _acct_record(pid: int, ppid: int, start: int, ticks: tuple[int, int], comm: bytes) -> bytes:
    """One ``struct acct_v3`` as the kernel writes it (times in ``comp_t``)."""
    import struct

    def comp(value: int) -> int:
        exponent = 0
        while value > 0x1FFF:
            value, exponent = value >> 3, exponent + 1
        return value | exponent << 13

    utime, stime = (comp(t) for t in ticks)
    fields = (0, 3, 0, 0, 0, 0, pid, ppid, start, 250.0, utime, stime, 0, 0, 0, 0, 0, 0, comm)
    return struct.pack("<BBHIIIIIIf8H16s", *fields)


def test_short_processes_from_accounting_are_charged_through_their_parents(tmp_path) -> None:
    """A process no sample saw (from ``accton``'s file) is charged to the test its pytest worker
    ran when it started, and so is its own child; one the census sampled is not counted twice."""
    load_benchmark("proc_census.py")  # puts benchmarks/ on the path
    import proc_acct

    raw_file = tmp_path / "pacct"
    raw_file.write_bytes(
        _acct_record(200, 100, 1000, (150, 30), b"python")  # 1.8 CPU-s
        + _acct_record(201, 200, 1001, (9000, 0), b"fedtune")  # 90 s: a comp_t exponent
        + _acct_record(300, 100, 1000, (50, 0), b"python")  # sampled by the census
        + _acct_record(400, 1, 1000, (0, 0), b"sleep")  # no CPU: left out
    )
    exited = proc_acct.read(raw_file)
    assert [(r["pid"], r["cpu_s"], r["comm"]) for r in exited] == [
        (200, 1.8, "python"),
        (201, 90.0, "fedtune"),
        (300, 0.5, "python"),
    ]
    sampled = [
        {"pid": 100, "ppid": 1, "start": 1, "start_at": 900.0, "test": "", "cpu_s": 9.0},
        {  # sampled once, at 0.2 CPU-s: its exit record has the rest
            "pid": 300,
            "ppid": 100,
            "start": 2,
            "start_at": 1000.3,
            "cpu_s": 0.2,
            "test": "tests/unit/test_b.py::u (call)",
        },
    ]
    assert proc_acct.lifetimes(exited, sampled) == {(300, 2): 0.5}
    tests = [
        {"test": "tests/unit/test_z.py::before", "pid": 100, "start": 990.0, "end": 997.0},
        {"test": "tests/unit/test_a.py::t", "pid": 100, "start": 999.0, "end": 1003.0},
    ]
    charged = [(r["pid"], f) for r, f in proc_acct.unseen(exited, sampled, tests)]
    assert charged == [(200, "tests/unit/test_a.py"), (201, "tests/unit/test_a.py")]


def test_the_report_counts_short_processes_apart() -> None:
    bench = load_benchmark("proc_census.py")
    raw = {
        "wall_s": 10.0,
        "processes": [
            {
                "pid": 100,
                "ppid": 1,
                "start": 1,
                "start_at": 900.0,
                "test": "",
                "cpu_s": 3.0,
                "argv": ["python", "-c", "import sys;exec(eval(sys.stdin.readline()))"],
                "comm": "python",
            },
        ],
        "exited": [
            {
                "pid": 200,
                "ppid": 100,
                "start_at": 1000.0,
                "elapsed_s": 1.0,
                "cpu_s": 1.5,
                "comm": "python",
            },
        ],
    }
    tests = [{"test": "tests/unit/test_a.py::t", "pid": 100, "start": 999.0, "end": 1003.0}]
    report = bench.report(raw, top=5, tests=tests)
    assert report["cpu_s_short"] == 1.5
    assert report["cpu_s_all"] == 4.5 and report["cpu_s_pytest"] == 3.0
    assert report["kinds"] == {"python (short)": {"processes": 1, "cpu_s": 1.5}}
    assert report["test_files"] == {"tests/unit/test_a.py": {"processes": 1, "cpu_s": 1.5}}


def test_the_report_ranks_the_cpu_pytest_spent_in_each_test() -> None:
    bench = load_benchmark("proc_census.py")
    raw = {"wall_s": 10.0, "processes": [], "exited": []}
    tests = [
        {"test": "tests/unit/test_a.py::t1", "pid": 100, "start": 1.0, "end": 2.0, "cpu_s": 0.5},
        {"test": "tests/unit/test_b.py::t", "pid": 101, "start": 1.0, "end": 3.0, "cpu_s": 2.0},
        {"test": "tests/unit/test_a.py::t2", "pid": 100, "start": 2.0, "end": 4.0, "cpu_s": 1.7},
        {"test": "tests/unit/test_c.py::old", "pid": 100, "start": 4.0, "end": 5.0},  # no cpu_s
    ]
    report = bench.report(raw, top=2, tests=tests)
    assert report["pytest_cpu_s_in_tests"] == 4.2
    assert report["pytest_test_files"] == {"tests/unit/test_a.py": 2.2, "tests/unit/test_b.py": 2.0}
    assert report["pytest_tests"] == {
        "tests/unit/test_b.py::t": 2.0,
        "tests/unit/test_a.py::t2": 1.7,
    }
    assert "pytest_tests" not in bench.report(raw, top=2, tests=tests[3:])  # an older timeline


def test_a_daemons_later_child_is_charged_to_the_test_running_when_it_started() -> None:
    """A session's server (started in test A, whose name its environment keeps) starts a child
    during test B: with the timeline, the child is B's; without it, A's (its environment)."""
    bench = load_benchmark("proc_census.py")
    first, later = "tests/unit/test_a.py::t (setup)", "tests/unit/test_b.py::t (call)"

    def proc(pid: int, ppid: int, start: int, test: str, argv: list[str]) -> dict:
        at = 900.0 + start
        return {"pid": pid, "ppid": ppid, "start": start, "start_at": at, "test": test,
                "cpu_s": 2.0, "argv": argv, "comm": argv[0]}  # fmt: skip

    worker = ["python", "-c", "import sys;exec(eval(sys.stdin.readline()))"]
    raw = {
        "wall_s": 10.0,
        "processes": [
            proc(100, 1, 1, "", worker),
            proc(200, 100, 100, first, ["raylet"]),  # started in test A
            proc(300, 200, 200, first, ["python", "default_worker.py"]),  # started in test B
            proc(400, 1, 5, "", ["sshd"]),  # no pytest worker above it, no test
        ],
    }
    tests = [
        {"test": first.split(" ")[0], "pid": 100, "start": 995.0, "end": 1010.0},
        {"test": later.split(" ")[0], "pid": 100, "start": 1090.0, "end": 1110.0},
    ]
    files = bench.report(raw, top=5, tests=tests)["test_files"]
    assert files == {
        "tests/unit/test_a.py": {"processes": 1, "cpu_s": 2.0},
        "tests/unit/test_b.py": {"processes": 1, "cpu_s": 2.0},
        "-": {"processes": 1, "cpu_s": 2.0},
    }
    files = bench.report(raw, top=5)["test_files"]  # no timeline: the environment's test
    assert files["tests/unit/test_a.py"] == {"processes": 2, "cpu_s": 4.0}


def test_a_workers_own_child_is_charged_to_the_test_in_its_environment() -> None:
    """A pytest worker's child that starts within the second after a test's end (its start comes
    from ``btime``, whole seconds) is charged to the test its environment names, not the one
    before that the timeline also matches."""
    bench = load_benchmark("proc_census.py")
    worker = ["python", "-c", "import sys;exec(eval(sys.stdin.readline()))"]
    later = "tests/unit/test_b.py::t (setup)"
    raw = {
        "wall_s": 10.0,
        "processes": [
            {"pid": 100, "ppid": 1, "start": 1, "start_at": 900.0, "test": "", "cpu_s": 1.0,
             "argv": worker, "comm": "python"},
            {"pid": 200, "ppid": 100, "start": 2, "start_at": 1009.5, "test": later,
             "cpu_s": 2.0, "argv": ["fedtune", "serve"], "comm": "fedtune"},
        ],
    }  # fmt: skip
    tests = [
        {"test": "tests/unit/test_a.py::t", "pid": 100, "start": 995.0, "end": 1010.0},
        {"test": "tests/unit/test_b.py::t", "pid": 100, "start": 1010.0, "end": 1020.0},
    ]
    files = bench.report(raw, top=5, tests=tests)["test_files"]
    assert files == {"tests/unit/test_b.py": {"processes": 1, "cpu_s": 2.0}}
