"""A throw-away local Ray cluster for the tests — a head and, on demand, worker nodes on this
machine — and a ``ray stop`` that stops only it.

``ray start --head`` runs in a new session (``start_new_session``) with free ports and its own
``--temp-dir`` (so its address file never makes anyone else's ``ray.init()`` connect to it) and
token authentication with a token of its own (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``;
:attr:`LocalRayCluster.client_env` is what a client needs to talk to it).
Every process of that cluster keeps the session id. Plain ``ray stop`` kills *every* Ray
process of the machine — other people's clusters included — so :meth:`LocalRayCluster.stop`
does what ``ray stop`` does (:func:`stop_sessions`: SIGTERM in Ray's order, a grace period,
then SIGKILL) to the processes of its nodes' sessions only, all nodes at once.

:meth:`LocalRayCluster.add_node` starts a worker node (``ray start --address=<head's GCS>``) in
a session of its own, with its own temp dir and ports, ``--num-gpus`` *logical* GPUs and a
custom resource ``ft_node_<name>`` that tells the nodes apart (``ray.nodes()`` shows it). A
node's processes — its raylet, agents and the worker processes that run its tasks — all carry
that session, so :meth:`RayNode.kill` takes exactly one node down (``SIGKILL``, as a lost
machine) and nothing else. Start-ups are given generous time and one retry, worker nodes more
(a loaded machine; ``tests/ray_start.py``); every try draws its ports anew (``tests/ports.py``).

:class:`PidNamespace` gives a cluster a PID namespace (with its own ``/proc``) of its own, as the
machines of a real cluster are: its processes (every node's: they are co-located there, the
harder case) see each other and nothing of this machine outside it — not the service, MLflow
or the test. ``LocalRayCluster(..., enter=ns.enter)`` starts every ``ray start`` in it
(``nsenter``); the sessions, stops and kills work as before, from outside.

``LocalRayCluster(..., lean=True)`` leaves out what only costs CPU where the drivers take no
worker logs (fedtune's drivers run with ``log_to_driver=False``) and nothing autoscales, as the
tests' in-process Ray does (``tests/ray_start.py``, which owns the settings): no log monitor on
any node, no autoscaler monitor on the head, dashboard agents that sample their node's
processes every :data:`~tests.ray_start.LEAN_REPORT_MS` ms instead of every 5 s, and no idle
Python workers prestarted by a raylet for its node's first driver, one per CPU of the node
(:data:`~tests.ray_start.NO_PRESTART_ENV`: the product's ``NO_PRESTART``); a task or actor
still gets a worker when it needs one. A worker node's dashboard agent is a minimal one
(:mod:`fedtune.tuning.driver.ray_agent`: none of its modules, as on a node of ``pip install
ray``, so no metrics are exported on that node, and no metrics ports are given to it), as an
embedded head's without a dashboard is: the Jobs API reaches only the head's agent (a job's
driver runs on the head), and a node's runtime-env agent, which unpacks a study's code, is a
process of its own. The head keeps the full agent (its Jobs agent).
``LocalRayCluster(..., dashboard_modules=("JobHead", ...))`` gives the head a dashboard of those
modules only (the APIs its tests call; each other module is a process of its own) and no Ray Client
server, which nothing of the tests' uses (``ray start`` has no flag for either). Every node starts
with a ``ray`` CLI (:func:`ray_cli`) that imports none of its command groups ``ray start`` never
uses (:data:`CLI_GROUPS_UNUSED`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from tests.ports import free_ports
from tests.procs import live_name, wait_gone
from tests.ray_start import (
    LEAN_ENV,
    NO_PRESTART_ENV,
    NODE_RETRY_BACKOFF_S,
    NODE_START_RETRIES,
    START_RETRIES,
    START_TIMEOUT_S,
    lean_flags,
)

BIN = Path(sys.executable).parent

#: Ray's own order of a ``ray stop``: raylets first (else their fate-sharing agents complain),
#: gcs_server last (after everything that talks to it), the rest between
_STOP_ORDER = ("raylet", None, "gcs_server")
#: a stop's SIGTERM-to-SIGKILL grace, shared by its three steps (``ray stop --grace-period``)
STOP_GRACE_S = 10.0


def session_pids(session: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                if os.getsid(int(entry)) == session:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def _kill_session(session: int) -> None:
    for pid in session_pids(session):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def stop_sessions(sessions: Sequence[int], grace_s: float = STOP_GRACE_S) -> None:
    """Stop the Ray processes of ``sessions`` as ``ray stop`` does, but only theirs.

    Ray's order (:data:`_STOP_ORDER`): SIGTERM to the raylets, then to the rest, then to the
    gcs_servers, each step waiting up to a third of ``grace_s`` for them to exit; whatever is
    left is SIGKILLed. Every node's session at once: one pass for the cluster, no wait for a
    process already gone, and no ``ray stop`` process of its own (importing Ray costs seconds).

    Args:
        sessions: the session ids (``os.getsid``) whose processes to stop.
        grace_s: the seconds the three SIGTERM steps may wait, in all.
    """
    pids = [p for s in sessions for p in session_pids(s)]
    names = {p: live_name(p) for p in pids}
    for step in _STOP_ORDER:
        group = [
            p
            for p, name in names.items()
            if name is not None and (name == step or (step is None and name not in _STOP_ORDER))
        ]
        for pid in group:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
        wait_gone(group, grace_s / len(_STOP_ORDER))
    for session in sessions:
        _kill_session(session)  # stragglers of *these* sessions only
    # and until their parent (init, a reaper) has reaped them: then nothing of them is left
    deadline = time.monotonic() + 30
    while any(session_pids(s) for s in sessions) and time.monotonic() < deadline:
        time.sleep(0.1)


#: the ports of a dashboard agent's metrics agent (its gRPC server) and of its metrics exporter
_METRICS_PORTS = ("dashboard-agent-grpc-port", "metrics-export-port")


def _node_ports(exclude: tuple[int, ...] = (), *, minimal_agent: bool = False) -> list[str]:
    """A node's ports, distinct from each other and from ``exclude`` (:func:`free_ports`).

    Args:
        exclude: Ports already taken.
        minimal_agent: The node's dashboard agent is minimal: none for its metrics
            (:data:`_METRICS_PORTS`), which it does not serve. Ray then takes the port that the
            agent records (none), and the raylet and workers know at once that there is no
            metrics agent; given a port, the raylet tries to reach one there for about 30 s
            (*Failed to establish connection to the metrics exporter agent* in ``raylet.err``).

    Returns:
        The ``ray start`` flags of the ports.
    """
    names = (
        "node-manager-port",
        "object-manager-port",
        "dashboard-agent-listen-port",
        *(() if minimal_agent else _METRICS_PORTS),
        "runtime-env-agent-port",
    )
    ports = free_ports(len(names), exclude)
    return [f"--{name}={port}" for name, port in zip(names, ports, strict=True)]


def _head_ports(dashboard: int, gcs: int, client: bool = True) -> list[str]:
    """The head's Ray Client port (``client``) and node ports, distinct from its dashboard and
    GCS ports."""
    if not client:
        return _node_ports((dashboard, gcs))
    (port,) = free_ports(1, (dashboard, gcs))
    return [f"--ray-client-server-port={port}", *_node_ports((dashboard, gcs, port))]


#: what a head's dashboard needs to serve fedtune's ``ray`` backend (``dashboard_modules``): the
#: Jobs API (submit, status, logs, ``/api/version``), the state API (``/api/v0/nodes``) and the
#: node module, which records the head's node id (the Jobs API submits through the head's agent,
#: found by it); none of the web UI's other modules
BACKEND_MODULES = ("JobHead", "StateHead", "NodeHead")

#: the ``ray`` CLI's command groups that ``ray start`` never uses (Serve's, the Jobs', the state
#: API's), each imported by ``ray.scripts.scripts`` inside a ``try`` that leaves it out when it
#: fails to import: blocked in :data:`_RAY_CLI` (Serve's alone imports FastAPI and pandas: a
#: ``ray start`` costs 0.7 CPU-s instead of 2)
CLI_GROUPS_UNUSED = (
    "ray.serve.scripts",
    "ray.dashboard.modules.job.cli",
    "ray.util.state.state_cli",
)

#: ``ray`` (its CLI, as ``bin/ray`` runs it) without :data:`CLI_GROUPS_UNUSED`, for every node's
#: ``ray start``. Its first argument, the dashboard modules to load (``JobHead,StateHead``:
#: ``--modules-to-load`` of the dashboard process, which ``ray start`` has no flag for), is taken
#: off; when it is not empty (a head that serves only some APIs) no Ray Client server is started
#: either (``ray start --head`` starts one whenever its dependencies are installed). Its second,
#: when not empty, has the node run its dashboard agent as a minimal one, through the product's
#: builder (``ray_lean.minimal_agent_builder``, as a lean embedded head without dashboard does)
_RAY_CLI = """
import sys

for name in sys.argv.pop(1).split(","):
    sys.modules[name] = None  # ``from`` it raises ImportError: ``ray`` leaves its group out

from ray._private import services
from ray.scripts import scripts

modules = sys.argv.pop(1)
minimal_agent = sys.argv.pop(1)
start = services.start_ray_process


def start_ray_process(command, process_type, *args, **kwargs):
    if process_type == "dashboard":
        command = [*command, f"--modules-to-load={modules}"]
    return start(command, process_type, *args, **kwargs)


if modules:
    services.start_ray_process = start_ray_process
    scripts.get_ray_client_dependency_error = lambda: "not for this head"
if minimal_agent:
    from fedtune.tuning.driver.ray_lean import minimal_agent_builder

    services._build_python_executable_command_memory_profileable = minimal_agent_builder(services)
sys.argv[0] = "ray"
sys.exit(scripts.main())
"""


def ray_cli(modules: Sequence[str] | None = None, *, minimal_agent: bool = False) -> list[str]:
    """The command of the ``ray`` CLI that starts this cluster's nodes (:data:`_RAY_CLI`).

    Args:
        modules: A head's dashboard modules, when not all (then no Ray Client server either).
        minimal_agent: Whether the node's dashboard agent is a minimal one
            (``ray_lean.MINIMAL_AGENT``: none of its modules, as on a node of ``pip install ray``).

    Returns:
        ``python -c _RAY_CLI <blocked groups> <modules> <1 for a minimal agent, or empty>``, to
        which ``ray``'s arguments are added.
    """
    return [
        sys.executable,
        "-c",
        _RAY_CLI,
        ",".join(CLI_GROUPS_UNUSED),
        ",".join(modules or ()),
        "1" if minimal_agent else "",
    ]


#: the first process of a :class:`PidNamespace`: reaps what is reparented to it, for ever
_REAPER = """
import os, time
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
"""


class PidNamespace:
    """A PID namespace with a ``/proc`` of its own (``unshare --pid --fork --mount-proc``), held
    by a reaper as its first process; :attr:`enter` runs a command in it. Closing it kills the
    holder, and with it (``--kill-child``: its first process dies, the kernel ends the rest)
    everything in it. Needs root."""

    def __init__(self) -> None:
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        self.holder = subprocess.Popen(
            [*argv, sys.executable, "-c", _REAPER],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        self.init = self._first_process()

    def _first_process(self) -> int:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == self.holder.pid:
                    return int(entry)
            time.sleep(0.05)
        self.close()
        raise RuntimeError("unshare started no first process for the PID namespace")

    @property
    def enter(self) -> list[str]:
        """The prefix that runs a command in the namespace (its PID and mount namespaces)."""
        return ["nsenter", f"--target={self.init}", "--pid", "--mount", "--"]

    def close(self) -> None:
        if self.holder.poll() is None:
            self.holder.kill()
        self.holder.wait(30)


class _Started:
    """One ``ray start`` (head or worker node): its session, temp dir and stop/kill."""

    def __init__(self, env: Mapping[str, str], prefix: str, enter: Sequence[str] = ()) -> None:
        self.env = dict(env)
        self.temp_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))  # short: sockets
        self.session: int | None = None
        self.enter = list(enter)  # a prefix that starts it elsewhere (``PidNamespace.enter``)

    def _start(
        self,
        argv_of: Callable[[], list[str]],
        retries: int = START_RETRIES,
        backoff_s: float = 0.0,
    ) -> None:
        """Run ``ray start`` with ``argv_of()`` until it succeeds, ``retries`` more times at most.

        Args:
            argv_of: the command of one try; called again for each (fresh ports: a port taken
                between its choice and Ray's bind fails one try, not every one).
            retries: how many more tries after a failed one.
            backoff_s: the wait before try ``k`` is ``k`` times this.
        """
        for attempt in range(retries + 1):
            time.sleep(backoff_s * attempt)  # a loaded machine: give it time to settle
            argv = argv_of()
            proc = subprocess.Popen(
                [*self.enter, *argv, f"--temp-dir={self.temp_dir}"],
                env=self.env,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            self.session = proc.pid
            try:
                out, _ = proc.communicate(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                out, proc.returncode = b"(timed out)", -1
            if proc.returncode == 0:
                return
            self._halt()
            self.temp_dir.mkdir(parents=True, exist_ok=True)
            if attempt == retries:
                self.close()
                raise RuntimeError(f"{argv[:3]} failed:\n{out.decode()[-3000:]}")

    def _halt(self) -> None:
        if self.session is not None:
            stop_sessions([self.session])
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL every process of this session at once (a node lost, no goodbye)."""
        if self.session is not None:
            _kill_session(self.session)

    def close(self) -> None:
        self._halt()
        self.session = None

    @property
    def pids(self) -> list[int]:
        return [] if self.session is None else session_pids(self.session)


class RayNode(_Started):
    """A worker node of a :class:`LocalRayCluster` (see the module docstring)."""

    def __init__(self, cluster: LocalRayCluster, name: str, env: Mapping[str, str]) -> None:
        super().__init__({**cluster.env, **env}, "ftrw-", cluster.enter)
        self.name = name
        self.resource = f"ft_node_{name}"


class LocalRayCluster(_Started):
    def __init__(
        self,
        env: Mapping[str, str],
        head_cpus: int = 1,
        enter: Sequence[str] = (),
        *,
        lean: bool = False,
        dashboard_modules: Sequence[str] | None = None,
    ) -> None:
        self.client_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        full = {
            **os.environ,
            **env,
            **self.client_env,
            "RAY_USAGE_STATS_ENABLED": "0",
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        }
        if lean:  # every node's: a worker node starts from the head's environment
            full.update({**LEAN_ENV, **NO_PRESTART_ENV})
        #: ``ray start`` flags of every worker node (a lean cluster's: no log monitor)
        self.node_flags = lean_flags(head=False) if lean else []
        self.lean = lean
        #: the head's dashboard modules (``JobHead``, ``StateHead``, ...: the APIs a test calls)
        #: when not all, and then no Ray Client server (:func:`ray_cli`)
        self.dashboard_modules = dashboard_modules
        full.pop("RAY_ADDRESS", None)
        super().__init__(full, "ftray-", enter)
        self.head_cpus = head_cpus
        self._choose_ports()
        self.nodes: list[RayNode] = []

    def _choose_ports(self) -> None:
        """Free dashboard and GCS ports, and the addresses they make (each start try anew)."""
        self.dashboard_port, self.gcs_port = free_ports(2)
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.gcs_address = f"127.0.0.1:{self.gcs_port}"

    def start(self) -> LocalRayCluster:
        """Start the head (:meth:`_start`: a retry draws all its ports anew) and return self."""
        self._start(self._head_argv)
        return self

    def _head_argv(self) -> list[str]:
        self._choose_ports()
        modules = self.dashboard_modules
        return [
            *ray_cli(modules),
            "start",
            "--head",
            f"--num-cpus={self.head_cpus}",
            "--disable-usage-stats",
            "--dashboard-host=127.0.0.1",
            "--include-dashboard=true",
            "--object-store-memory=100000000",
            f"--port={self.gcs_port}",
            f"--dashboard-port={self.dashboard_port}",
            *_head_ports(self.dashboard_port, self.gcs_port, client=modules is None),
            *(lean_flags(head=True) if self.lean else []),
        ]

    def add_node(
        self,
        name: str,
        *,
        num_cpus: int = 1,
        num_gpus: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> RayNode:
        """Start a worker node ``name`` (its resource ``ft_node_<name>``: 1) and return it."""
        node = RayNode(self, name, env or {})

        def argv() -> list[str]:  # each try its own ports
            return [
                *ray_cli(minimal_agent=self.lean),
                "start",
                f"--address={self.gcs_address}",
                f"--num-cpus={num_cpus}",
                f"--num-gpus={num_gpus}",
                f"--resources={json.dumps({node.resource: 1})}",
                "--disable-usage-stats",
                "--object-store-memory=100000000",
                *_node_ports(minimal_agent=self.lean),
                *self.node_flags,
            ]

        node._start(argv, retries=NODE_START_RETRIES, backoff_s=NODE_RETRY_BACKOFF_S)
        self.nodes.append(node)
        return node

    def stop(self) -> None:
        """Stop the worker nodes and the head together (by their own sessions only)."""
        stop_sessions(self.sessions)
        for node in self.nodes:
            node.close()  # their temp dirs; nothing of theirs is left to stop
        self.close()

    @property
    def sessions(self) -> list[int]:
        return [s for s in (self.session, *(n.session for n in self.nodes)) if s is not None]
