"""Ray start-up retries, the one-line ``RayStartError`` and reaping a killed driver's Ray
processes; ``fedtune tune`` when Ray never starts."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedtune.cli import main
from fedtune.errors import ConfigError, RayStartError, TransientError
from fedtune.tuning.driver import ray_runtime as rr
from fedtune.tuning.driver.ray_runtime import (
    RAY_TEMP_MAX,
    TEMP_PREFIX,
    RayStartPolicy,
    discard_temp_dir,
    make_ray_temp_dir,
    ray_temp_dir,
    reap_orphans,
    remove_temp_dir,
    start_ray,
)

_TIMEOUT = TimeoutError(
    "Timed out after 60 seconds while waiting for node to startup.\n"
    "Did not find socket name /tmp/x/sockets/plasma_store in the list of object store socket names."
)


class FlakyInit:
    """``ray.init`` that fails ``failures`` times, then succeeds; records its calls."""

    def __init__(self, failures: int, error: Exception = _TIMEOUT) -> None:
        self.failures, self.error, self.calls = failures, error, []

    def __call__(self, **kwargs):
        self.calls.append(kwargs)
        if len(self.calls) <= self.failures:
            raise self.error


def test_start_up_is_retried_with_backoff_then_succeeds(tmp_path: Path) -> None:
    init, sleeps, shutdowns = FlakyInit(2), [], []
    start_ray(
        RayStartPolicy(attempts=3, backoff_s=0.5),
        temp_dir=tmp_path,
        init=init,
        shutdown=lambda: shutdowns.append(1),
        sleep=sleeps.append,
        num_cpus=1,
    )
    assert len(init.calls) == 3 and sleeps == [0.5, 1.0] and len(shutdowns) == 2
    kwargs = init.calls[-1]
    assert kwargs["_temp_dir"] == str(tmp_path) and kwargs["num_cpus"] == 1
    assert kwargs["_system_config"]["worker_register_timeout_seconds"] >= 120


def test_an_embedded_ray_prestarts_no_idle_workers(tmp_path: Path) -> None:
    """Ray prestarts one idle Python worker per CPU, which Tune's trial actors
    never use; an embedded Ray of a study starts none (the caller may still ask for them)."""
    init = FlakyInit(0)
    start_ray(temp_dir=tmp_path, init=init, shutdown=lambda: None)
    config = init.calls[-1]["_system_config"]
    assert config["enable_worker_prestart"] is False
    assert config["prestart_worker_first_driver"] is False
    start_ray(
        temp_dir=tmp_path,
        init=init,
        shutdown=lambda: None,
        _system_config={"enable_worker_prestart": True},
    )
    assert init.calls[-1]["_system_config"]["enable_worker_prestart"] is True
    start_ray(address="10.0.0.1:6379", init=init, shutdown=lambda: None)  # a cluster's own
    assert "_system_config" not in init.calls[-1]


def test_an_embedded_ray_head_starts_no_log_or_autoscaler_monitor(
    tmp_path: Path, monkeypatch
) -> None:
    """The head node of an embedded Ray (what ``ray.init`` builds in ``start_ray``) starts as
    ``ray start --include-log-monitor=false --no-monitor`` does, its dashboard agent sampling
    every LEAN_REPORT_MS ms: the driver takes no worker logs, nothing autoscales it and it has
    no dashboard. A cluster's own nodes and any node started outside ``start_ray`` keep Ray's
    defaults."""
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    from fedtune.tuning.driver.ray_lean import LEAN_ENV

    seen: list[tuple[bool, object, object, bool]] = []

    def node(self, ray_params, head=False, **kwargs) -> None:  # records, starts nothing
        lean_env = (ray_params.env_vars or {}).items() >= LEAN_ENV.items()
        seen.append((head, ray_params.include_log_monitor, ray_params.no_monitor, lean_env))

    def init(**kwargs) -> None:  # as ray.init: a head node of its own, here with a worker's
        Node(RayParams(), head=True)
        Node(RayParams(), head=False)

    monkeypatch.setattr(Node, "__init__", node)
    start_ray(temp_dir=tmp_path, init=init, shutdown=lambda: None)
    assert seen == [(True, False, True, True), (False, None, False, False)]
    assert Node.__init__ is node  # put back
    seen.clear()
    start_ray(address="10.0.0.1:6379", init=init, shutdown=lambda: None)  # a cluster's own
    init()  # outside start_ray
    assert seen == [(True, None, False, False), (False, None, False, False)] * 2


def test_when_every_attempt_fails_the_error_is_one_transient_line() -> None:
    init, sleeps = FlakyInit(99), []
    with pytest.raises(RayStartError) as err:
        start_ray(
            RayStartPolicy(attempts=2, backoff_s=1.0),
            init=init,
            shutdown=lambda: None,
            sleep=sleeps.append,
            address="ray://head:10001",
        )
    message = str(err.value)
    assert "\n" not in message and len(init.calls) == 2 and sleeps == [1.0]
    assert message.startswith("Ray did not start (ray://head:10001) after 2 attempt(s)")
    assert "TimeoutError: Timed out after 60 seconds" in message
    assert isinstance(err.value, TransientError)


def test_argument_errors_are_not_retried() -> None:
    init = FlakyInit(99, ValueError("unknown argument"))
    with pytest.raises(ValueError):
        start_ray(RayStartPolicy(attempts=3), init=init, shutdown=lambda: None, sleep=print)
    assert len(init.calls) == 1


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"FEDTUNE_RAY_START_ATTEMPTS": "0"}, "FEDTUNE_RAY_START_ATTEMPTS"),
        ({"FEDTUNE_RAY_START_ATTEMPTS": "three"}, "FEDTUNE_RAY_START_ATTEMPTS"),
        ({"FEDTUNE_RAY_START_BACKOFF_S": "-1"}, "FEDTUNE_RAY_START_BACKOFF_S"),
    ],
)
def test_the_policy_from_the_environment_names_a_bad_variable(env: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        RayStartPolicy.from_env(env)
    assert err.value.field == field
    policy = RayStartPolicy.from_env({"FEDTUNE_RAY_START_ATTEMPTS": "5"})
    assert (policy.attempts, policy.backoff_s) == (5, RayStartPolicy().backoff_s)


def test_the_temp_dir_is_short_and_only_hashed_dirs_are_removed(tmp_path: Path) -> None:
    assert ray_temp_dir(Path("/w/s")) == Path("/w/s/ray")
    long = ray_temp_dir(tmp_path / ("x" * 60))
    assert long.parent == Path("/tmp") and long.name.startswith("fedtune-ray-")
    assert len(long.name) == len("fedtune-ray-") + 10
    mine = tmp_path / "ray"
    mine.mkdir()
    assert not remove_temp_dir(mine) and mine.is_dir()  # never anything but /tmp/fedtune-ray-*


def _spawn(argv: list[str], stdout=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=stdout, stderr=subprocess.DEVNULL)


def test_reaping_stops_only_the_processes_of_that_temp_dir(tmp_path: Path) -> None:
    temp = tmp_path / "fedtune-ray-0123456789"
    logs = temp / "session_2026-01-01_00-00-00_1_1" / "logs"
    logs.mkdir(parents=True)
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    procs = {}
    try:
        with (logs / "worker-1.out").open("w") as out:  # like ray::IDLE: a log file held open
            procs["fd"] = _spawn(["sleep", "600"], stdout=out)
        procs["argv"] = _spawn([*sleeper, f"--temp_dir={temp}"])  # like raylet, gcs_server
        procs["sibling"] = _spawn([*sleeper, f"--temp_dir={temp}0/session"])  # another dir
        procs["other"] = _spawn(["sleep", "600"])  # another cluster, anything else
        reaped = reap_orphans(temp, grace_s=10)
        assert sorted(reaped) == sorted([procs["fd"].pid, procs["argv"].pid])
        for name in ("fd", "argv"):
            assert procs[name].wait(10) < 0  # ended by a signal
        assert procs["sibling"].poll() is None and procs["other"].poll() is None
        assert reap_orphans(temp) == []
    finally:
        for proc in procs.values():
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait(10)


def test_fedtune_tune_prints_one_line_when_ray_never_starts(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    import ray

    from tests.integration.conftest import make_quadratic_study

    calls = []

    def never(**kwargs):
        calls.append(kwargs)
        raise _TIMEOUT

    monkeypatch.setattr(ray, "init", never)
    # a session fixture may hold a Ray of its own in this process; run_study would reuse it
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # and must not stop it
    monkeypatch.setattr(rr.time, "sleep", lambda s: None)
    monkeypatch.setenv("FEDTUNE_RAY_START_ATTEMPTS", "2")
    spec = tmp_path / "study.yaml"
    # one configuration per process: Ray's trials (pack auto would weigh them by cost)
    spec.write_text(yaml.safe_dump(make_quadratic_study("no-ray", resources={"pack": 1})))
    workdir = tmp_path / "a-workdir-long-enough-for-a-hashed-ray-temp-dir"
    code = main(["tune", str(spec), "--workdir", str(workdir), "--json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(calls) == 2
    assert err[-1].startswith("fedtune: error: Ray did not start (embedded) after 2 attempt(s)")
    assert "Traceback" not in "\n".join(err)
    # one error line; the only other lines: one notice per retry (when logging reaches stderr)
    # and the warning that the study's 5 trials are a small budget (fedtune.tuning.budget_advice)
    others = ("Ray start-up failed (attempt 1", "fedtune: warning: the budget is 5 full trials")
    assert [line for line in err if not line.startswith(others)] == [err[-1]]
    assert not ray_temp_dir(workdir.resolve()).exists()  # cleaned up although it failed


def test_every_ray_the_tests_start_gets_a_long_timeout_and_one_retry() -> None:
    """In-process ``ray.init`` in the tests goes through tests/ray_start.py."""
    from tests import ray_start

    tests = Path(__file__).resolve().parents[1]
    direct = [
        f"{path.relative_to(tests)}:{number}"
        for path in sorted(tests.rglob("*.py"))
        if path != tests / "ray_start.py"  # the one owner: its lean start calls ray.init
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*ray\.init\(", line)
    ]
    assert direct == []
    assert ray_start.POLICY.attempts == 2 and ray_start.START_TIMEOUT_S >= 180
    from tests.service import ray_cluster  # `ray start` subprocesses: the same timeout, retry

    assert ray_cluster.START_TIMEOUT_S is ray_start.START_TIMEOUT_S
    assert ray_cluster._Started._start.__defaults__ == (ray_start.START_RETRIES, 0.0)
    # a worker node's `ray start` has Ray's fixed 30 s to register: more tries, with a pause
    assert ray_start.NODE_START_RETRIES >= 3 and ray_start.NODE_RETRY_BACKOFF_S > 0


def test_a_ray_node_the_tests_start_gets_distinct_ports() -> None:
    """CI once gave Ray's runtime-env agent and its metrics exporter the same port (each from
    its own free_port()): a node's ports now come from one free_ports() call."""
    from tests.ports import free_ports
    from tests.service import ray_cluster

    for _ in range(20):
        head = ray_cluster._head_ports(*free_ports(2))
        ports = [int(arg.split("=")[1]) for arg in head]
        assert len(ports) == 7 and len(set(ports)) == 7
    taken = free_ports(10)
    assert len(set(taken)) == 10 and not set(free_ports(30, taken)) & set(taken)


def test_a_block_of_worker_ports_holds_no_port_the_test_drew() -> None:
    """CI-form run at 2bf40ff: a Ray node's worker ports were a fixed block (21000-21040) and its
    node manager's port, drawn from the same range, landed inside it (Ray refused to start). A
    block is now drawn free, and the ports drawn after it avoid it."""
    import socket

    from tests.ports import free_block, free_ports, quiet_range

    for _ in range(10):
        first = free_ports(3)
        block = free_block(41, exclude=first)
        assert len(block) == 41 and block.step == 1 and block.start in quiet_range()
        assert not set(block) & set(first)
        later = free_ports(20, exclude=[*first, *block])
        assert not set(later) & set(block)
        with socket.socket() as sock:  # free when returned: its ports bind
            sock.bind(("", block[len(block) // 2]))


def test_the_tests_ports_are_none_an_outgoing_connection_can_take() -> None:
    """CI (stop 69) lost a run to ``ray start --head`` finding its dashboard port "already
    occupied": the port came from the kernel's ephemeral range, which every outgoing connection
    draws from too. The tests' ports lie outside it, free on every address when chosen."""
    import socket

    from tests.ports import free_ports, quiet_range

    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    low, high = (int(x) for x in ephemeral.split())
    assert len(quiet_range()) >= 1000
    ports = free_ports(50)
    assert len(set(ports)) == 50
    assert all(p in quiet_range() and not low <= p <= high for p in ports)
    for port in ports[:5]:
        with socket.socket() as sock:
            sock.bind(("", port))  # still free: the choice held none of them


def test_a_failed_ray_start_tries_again_on_other_ports(monkeypatch) -> None:
    """A port taken between its choice and Ray's bind fails one try: the next draws anew."""
    from tests import ray_start
    from tests.service import ray_cluster

    tries: list[list[str]] = []

    class _Failed:
        pid, returncode = 0, 1

        def __init__(self, argv, **_) -> None:
            tries.append(argv)

        def communicate(self, timeout):
            return b"Failed to bind ... already occupied", None

    monkeypatch.setattr(ray_cluster.subprocess, "Popen", _Failed)
    monkeypatch.setattr(ray_cluster, "stop_sessions", lambda sessions: None)
    cluster = ray_cluster.LocalRayCluster({})
    with pytest.raises(RuntimeError, match="already occupied"):
        cluster.start()
    assert len(tries) == 1 + ray_start.START_RETRIES
    ports = [{a for a in argv if a.startswith("--dashboard-port=")} for argv in tries]
    assert ports[0] != ports[1]


def test_stragglers_of_a_normal_run_are_not_called_a_killed_drivers(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """After a normal run ``fedtune tune`` printed "stopping 1 Ray process(es)
    left … (a killed driver's)". Only processes found *before* Ray starts are a killed driver's;
    what outlives this driver's own ``ray.shutdown()`` is stopped quietly."""
    import logging

    import ray

    from fedtune.tuning.driver import ray_session

    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    temp = ray_temp_dir(tmp_path)
    temp.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []

    def start(**kwargs) -> None:  # a Ray whose agent outlives ray.shutdown()
        procs.append(_spawn([*sleeper, f"--temp_dir={kwargs['temp_dir']}"]))

    monkeypatch.setattr(ray_session, "start_ray", start)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    # the suite's session Ray (tests/integration's ray_local) may be up in this process: this
    # driver must start its own, as `fedtune tune` does, not reuse the caller's
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    caplog.set_level(logging.DEBUG, logger="fedtune.tuning.driver.ray_runtime")
    try:
        procs.append(_spawn([*sleeper, f"--temp_dir={temp}"]))  # a killed driver's leftover
        with ray_session.ray_session(tmp_path, address=None):
            killed = [r for r in caplog.records if "killed driver" in r.getMessage()]
            assert [r.levelno for r in killed] == [logging.WARNING]
            caplog.clear()
        assert all(p.wait(15) < 0 for p in procs)  # both stopped
        lines = [
            (r.levelno, r.getMessage()) for r in caplog.records if "stopping" in r.getMessage()
        ]
        assert len(lines) == 1 and lines[0][0] == logging.DEBUG, lines
        assert "killed driver" not in lines[0][1] and "outlived" in lines[0][1]
    finally:
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait(10)
        remove_temp_dir(temp)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder short enough for an in-workdir temp dir (pytest's tmp_path is too long)."""
    path = Path(tempfile.mkdtemp(prefix="ft", dir="/tmp"))
    assert len(str(path / "w" / "ray")) <= RAY_TEMP_MAX
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_the_temp_dir_is_private_and_a_tmp_one_has_an_unguessable_name(
    tmp_path: Path, short_dir: Path
) -> None:
    """0700 folders at names no other user can predict or plant first."""
    (short_dir / "w" / "ray").mkdir(parents=True, mode=0o755)  # an older driver's (umask)
    made = make_ray_temp_dir(short_dir / "w")
    assert made == short_dir / "w" / "ray" and stat.S_IMODE(made.stat().st_mode) == 0o700
    long = tmp_path / ("x" * 60)
    planted = ray_temp_dir(long)  # the hashed name an attacker could compute and create first
    first = make_ray_temp_dir(long)
    try:
        assert first != planted and first.parent == Path("/tmp")
        assert first.name.startswith(TEMP_PREFIX)
        assert stat.S_IMODE(first.stat().st_mode) == 0o700
        assert ray_temp_dir(long) == first  # recorded: a killed driver's processes are found
        assert make_ray_temp_dir(long) == first  # taken back by the next run
    finally:
        discard_temp_dir(long, first)
    assert not first.exists() and ray_temp_dir(long) == planted  # forgotten once removed
    second = make_ray_temp_dir(long)
    try:
        assert second != first  # a fresh random name each study run
    finally:
        discard_temp_dir(long, second)


def test_a_symlinked_temp_dir_is_refused(tmp_path: Path, short_dir: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    work = short_dir / "w"
    work.mkdir()
    (work / "ray").symlink_to(target)
    with pytest.raises(ConfigError, match="not a folder of this user"):
        make_ray_temp_dir(work)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # left alone


def test_a_lean_head_entered_in_another_thread_does_not_wait_for_the_first(monkeypatch) -> None:
    """A script run under the tests' ``lean_head`` (its main thread, for the whole script) that
    starts Ray through ``start_ray`` in a thread of its own (``fedtune tune --ray``'s
    ``fedtune-ray``) enters a second one there: it neither waits for the first to end (that was
    a hang) nor loses its fields; the patch goes when the last one ends."""
    import threading

    from ray._private.node import Node
    from ray._private.parameter import RayParams

    from fedtune.tuning.driver.ray_lean import lean_head

    seen: list[tuple[object, object]] = []

    def node(self, ray_params, head=False, **kwargs) -> None:  # records, starts nothing
        seen.append((ray_params.include_dashboard, ray_params.no_monitor))

    monkeypatch.setattr(Node, "__init__", node)
    with lean_head(include_dashboard=False):

        def start() -> None:
            with lean_head():
                Node(RayParams(), head=True)

        inner = threading.Thread(target=start)
        inner.start()
        inner.join(timeout=30)
        assert not inner.is_alive()
        assert seen == [(False, True)]  # lean, and without the outer's dashboard
        assert Node.__init__ is not node  # still the outer's
    assert Node.__init__ is node  # put back


def test_a_lean_head_without_dashboard_starts_no_dashboard_process(monkeypatch) -> None:
    """A lean head started with ``include_dashboard=False`` (a study's driver's) skips Ray's API
    server (the dashboard process, which would still serve the Jobs and state APIs); a lean head
    with a dashboard and any head outside ``lean_head`` start theirs; both patches go after."""
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    from fedtune.tuning.driver.ray_lean import lean_head

    served: list[object] = []

    def node(self, ray_params, head=False, **kwargs) -> None:  # as Node's: asks for the server
        self.start_api_server(include_dashboard=ray_params.include_dashboard, raise_on_failure=0)

    def api_server(self, *, include_dashboard, raise_on_failure) -> None:  # starts nothing
        served.append(include_dashboard)

    monkeypatch.setattr(Node, "__init__", node)
    monkeypatch.setattr(Node, "start_api_server", api_server)
    with lean_head():
        Node(RayParams(include_dashboard=False), head=True)
        Node(RayParams(include_dashboard=None), head=True)
    Node(RayParams(include_dashboard=False), head=True)
    assert served == [None, False]
    assert Node.__init__ is node and Node.start_api_server is api_server  # put back


def test_a_lean_test_cluster_starts_its_nodes_with_prestart_off() -> None:
    """A lean ``LocalRayCluster``'s nodes (head and workers) start no idle Python workers, as the
    product's embedded Ray (``NO_PRESTART``, one definition): a raylet reads each setting from
    ``RAY_<name>``. A cluster that is not lean keeps Ray's defaults."""
    from fedtune.tuning.driver.ray_runtime import NO_PRESTART
    from tests.ray_start import NO_PRESTART_ENV
    from tests.service import ray_cluster

    off = {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}
    assert off == NO_PRESTART_ENV
    assert {f"RAY_{name}" for name in NO_PRESTART} == off.keys()  # the product's settings, all
    lean = ray_cluster.LocalRayCluster({}, lean=True)
    plain = ray_cluster.LocalRayCluster({})
    node = ray_cluster.RayNode(lean, "w1", {})
    try:
        assert lean.env.items() >= off.items() and node.env.items() >= off.items()
        assert not plain.env.keys() & off.keys()
    finally:
        for started in (node, lean, plain):
            started.close()


def test_a_lean_head_without_dashboard_runs_a_minimal_dashboard_agent(monkeypatch) -> None:
    """The raylet of a lean head started with ``include_dashboard=False`` runs its dashboard
    agent through the minimal agent's wrapper (put before Ray's script, where Ray puts a memory
    profiler); its runtime-env agent, a lean head with a dashboard, a node that is no head, a
    command built meanwhile in another thread and any head outside ``lean_head`` keep Ray's
    command; the builder is put back after."""
    import threading

    from ray._private import ray_constants, services
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    from fedtune.tuning.driver.ray_lean import MINIMAL_AGENT, lean_head

    agent, env_agent = (
        ray_constants.PROCESS_TYPE_DASHBOARD_AGENT,
        ray_constants.PROCESS_TYPE_RUNTIME_ENV_AGENT,
    )
    build = services._build_python_executable_command_memory_profileable
    plain = build(agent, "/tmp/session")
    built: list[list[list[str]]] = []
    elsewhere: list[list[str]] = []

    def commands() -> list[list[str]]:  # as start_raylet builds its agents' commands
        builder = services._build_python_executable_command_memory_profileable
        return [builder(component, "/tmp/session") for component in (agent, env_agent)]

    def node(self, ray_params, head=False, **kwargs) -> None:  # builds, starts nothing
        other = threading.Thread(target=lambda: elsewhere.append(commands()[0]))
        other.start()
        other.join(timeout=30)
        built.append(commands())

    monkeypatch.setattr(Node, "__init__", node)
    with lean_head():
        Node(RayParams(include_dashboard=False), head=True)
        Node(RayParams(include_dashboard=None), head=True)
        Node(RayParams(include_dashboard=False), head=False)
    Node(RayParams(include_dashboard=False), head=True)
    assert built == [[[*plain, MINIMAL_AGENT], plain]] + [[plain, plain]] * 3
    assert elsewhere == [plain] * 4
    assert services._build_python_executable_command_memory_profileable is build  # put back


#: a stand-in for Ray's dashboard/agent.py: writes what it was run with to ``--out``
_AGENT_SCRIPT = """
import json, sys
import ray._private.utils
import ray.dashboard.utils as dashboard_utils

def imported():
    return {name for name in sys.modules if name.startswith("ray.dashboard.modules.")}

out = [a for a in sys.argv if a.startswith("--out=")][0][len("--out="):]
before = imported()
modules = dashboard_utils.get_all_modules(dashboard_utils.DashboardAgentModule)
with open(out, "w") as fh:
    json.dump({
        "name": __name__,
        "argv": sys.argv,
        "path0": sys.path[0],
        "minimal": ray._private.utils.get_dashboard_dependency_error() is not None,
        "modules": [m.__name__ for m in modules],
        "imported": sorted(imported() - before),
    }, fh)
"""


@pytest.mark.parametrize("given", [[], ["--minimal"]])
def test_the_minimal_agent_runs_rays_script_as_a_minimal_install_does(
    tmp_path: Path, monkeypatch, given: list[str]
) -> None:
    """The wrapper runs the agent's script as ``__main__`` with its arguments and ``--minimal``
    (once), from the script's folder, with Ray's check of the dashboard's dependencies failing
    (as without ``ray[default]``): the agent loads none of its modules, nor imports any module of
    Ray's dashboard to find that out (Ray's own search imports them all)."""
    import ray.dashboard.utils

    from fedtune.tuning.driver import ray_agent

    script = tmp_path / "dashboard" / "agent.py"
    script.parent.mkdir()
    script.write_text(_AGENT_SCRIPT)
    out = tmp_path / "seen.json"
    # what main changes in this process, put back after
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    # as ``python ray_agent.py`` starts: the wrapper's folder first on the path
    monkeypatch.setattr(sys, "path", [str(Path(ray_agent.__file__).parent), *sys.path])
    monkeypatch.setitem(sys.modules, ray_agent.OPTIONAL_DEPS, None)
    monkeypatch.setattr(ray.dashboard.utils, "get_all_modules", ray.dashboard.utils.get_all_modules)
    ray_agent.main([str(script), "--node-id=abc", f"--out={out}", *given])
    seen = json.loads(out.read_text())
    assert seen["name"] == "__main__" and seen["path0"] == str(script.parent)
    assert seen["argv"] == [str(script), "--node-id=abc", f"--out={out}", "--minimal"]
    assert seen["minimal"] is True and seen["modules"] == [] and seen["imported"] == []
