"""An embedded Ray without what a study's driver never uses.

A head node that ``ray.init`` starts always starts a log monitor (it tails every log file of
the node ten times a second, to print the workers' output in a driver that asks for it) and an
autoscaler monitor (for a cluster that grows and shrinks), and its dashboard agent samples the
node's processes every 5 s (for the dashboard's charts and metrics). A study's driver takes no
worker logs (``log_to_driver=False``), nothing autoscales its embedded Ray, and it starts no
dashboard (``include_dashboard=False``), so these only cost CPU. ``ray start`` leaves the two
monitors out with ``--include-log-monitor=false --no-monitor``; ``ray.init`` has no argument
for either, so :func:`lean_head` sets the same fields (:data:`LEAN_FIELDS`) of the
``RayParams`` that the head node starts from, on the way into ``ray._private.node.Node``, and
has the agent sample every :data:`LEAN_REPORT_MS` ms (:data:`LEAN_ENV`, in the raylet's
environment, which the agent inherits). A lean head started with ``include_dashboard=False``
(a study's driver's) starts no dashboard process at all: Ray's would still start one that serves
the APIs which are not the web UI's (Jobs, state, metrics), which no driver calls (~1 CPU-s).
Nor does its raylet run Ray's full dashboard agent, whose modules (the metrics agent and the
node's sampling among them, events, logs, health check, Jobs) serve a dashboard, Jobs or a
metrics scraper, none of which such a Ray has: it runs the agent as a node of a minimal Ray
install (``pip install ray``) does, without modules (:mod:`.ray_agent`, put before Ray's agent
script where Ray puts a memory profiler's command, :data:`MINIMAL_AGENT`). Ray then starts no
metrics export on the node either, so ``ray.util.metrics`` that trial code records go nowhere.
The node's runtime-env agent (a study's code, ``py_modules``/``working_dir``) is a process of its
own and is unchanged.

Light on purpose: Ray is imported only when :func:`lean_head` is entered.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "LEAN_ENV",
    "LEAN_FIELDS",
    "LEAN_REPORT_MS",
    "MINIMAL_AGENT",
    "lean_head",
    "minimal_agent_builder",
]

#: the ``RayParams`` fields of a lean head (each ``ray start`` flag of the same name)
LEAN_FIELDS: dict[str, bool] = {"include_log_monitor": False, "no_monitor": True}
#: a lean node's dashboard agent samples its node's processes this seldom (Ray: 5,000)
LEAN_REPORT_MS = 60_000
#: the environment of a lean node's raylet (and so of its agents)
LEAN_ENV = {"REPORTER_UPDATE_INTERVAL_MS": str(LEAN_REPORT_MS)}

#: guards :data:`_entered` and the patch of ``Node.__init__`` (held only while they change, never
#: while a lean head is entered: a script run under the tests' ``lean_head`` in its main thread
#: starts its Ray through ``start_ray`` in another thread, which enters one too)
_lock = threading.Lock()
#: the fields of each :func:`lean_head` now entered, in any thread of the process
_entered: list[dict[str, Any]] = []
#: ``Node.__init__``, ``Node.start_api_server`` and Ray's builder of its agents' Python command
#: as they were before the first :func:`lean_head` entered patched them
_original: tuple[Any, Any, Any] | None = None
#: ``minimal``: whether the head node this thread is starting has a minimal dashboard agent
_thread = threading.local()
#: the agent command's wrapper (:mod:`.ray_agent`), run by the Python that runs this one
MINIMAL_AGENT = str(Path(__file__).with_name("ray_agent.py"))


def minimal_agent_builder(services: Any, when: Callable[[], bool] = lambda: True) -> Any:
    """Ray's builder of an agent's Python command, running the dashboard agent through
    :data:`MINIMAL_AGENT` whenever ``when()`` is true.

    Args:
        services: ``ray._private.services``, whose builder
            (``_build_python_executable_command_memory_profileable``: where Ray puts a memory
            profiler, before the agent's script) is wrapped, not replaced.
        when: Asked at each command built: whether the agent is to be a minimal one.

    Returns:
        The builder to put in place of Ray's (which the caller keeps to put back).
    """
    build = services._build_python_executable_command_memory_profileable
    agent = services.ray_constants.PROCESS_TYPE_DASHBOARD_AGENT

    def lean_build(component: str, *args: Any, **kw: Any) -> list[str]:
        command = build(component, *args, **kw)
        if component == agent and when():
            command = [*command, MINIMAL_AGENT]  # before Ray's agent script: the wrapper's
        return command

    return lean_build


def _patch(node: type, services: Any) -> tuple[Any, Any, Any]:
    """Patch ``node`` so that a head node starts lean, with the fields of every
    :func:`lean_head` entered when it starts, and without a dashboard process and with a
    minimal dashboard agent (:mod:`.ray_agent`) when it starts with ``include_dashboard=False``.

    Args:
        node: Ray's ``Node`` class.
        services: ``ray._private.services``, whose builder of the Python command of an agent
            (``_build_python_executable_command_memory_profileable``: where Ray puts a memory
            profiler) gets :data:`MINIMAL_AGENT` added for such a head's dashboard agent.

    Returns:
        The ``__init__``, ``start_api_server`` and command builder it replaced.
    """
    start, api_server = node.__init__, node.start_api_server
    build = services._build_python_executable_command_memory_profileable

    def lean_start(self: Any, ray_params: Any, *args: Any, head: bool = False, **kw: Any):
        if head:
            with _lock:
                fields = {name: v for entered in _entered for name, v in entered.items()}
            ray_params.update(
                **LEAN_FIELDS, **fields, env_vars={**(ray_params.env_vars or {}), **LEAN_ENV}
            )
            self._fedtune_lean = True
        _thread.minimal = head and ray_params.include_dashboard is False
        try:
            start(self, ray_params, *args, head=head, **kw)
        finally:
            _thread.minimal = False

    def lean_api_server(self: Any, *, include_dashboard: bool | None, **kw: Any) -> None:
        if include_dashboard is False and getattr(self, "_fedtune_lean", False):
            return  # a lean head without dashboard: none of its APIs either
        api_server(self, include_dashboard=include_dashboard, **kw)

    node.__init__ = lean_start  # type: ignore[method-assign]
    node.start_api_server = lean_api_server  # type: ignore[attr-defined]
    services._build_python_executable_command_memory_profileable = minimal_agent_builder(
        services, lambda: getattr(_thread, "minimal", False)
    )
    return start, api_server, build


@contextlib.contextmanager
def lean_head(**fields: Any) -> Iterator[None]:
    """While it lasts, a head node started in this process (by ``ray.init``) is a lean one.

    Only a node started as a head changes; a ``ray.init(address=...)`` that joins a cluster
    starts none. Re-entrant, from any thread: the patch is the process's, made by the first
    entered and undone by the last to leave; a head started meanwhile gets the fields of all
    that are entered (an inner ``lean_head()`` inside an outer ``lean_head(include_dashboard=
    False)`` starts its head without the dashboard's web UI too).

    Args:
        fields: More ``RayParams`` fields of the head (e.g. ``include_dashboard=False``).
    """
    from ray._private import services
    from ray._private.node import Node

    global _original
    with _lock:
        if not _entered:
            _original = _patch(Node, services)
        _entered.append(fields)
    try:
        yield
    finally:
        with _lock:
            _entered[:] = [entered for entered in _entered if entered is not fields]
            if not _entered and _original is not None:
                Node.__init__, Node.start_api_server = _original[:2]  # type: ignore[method-assign]
                services._build_python_executable_command_memory_profileable = _original[2]
                _original = None
