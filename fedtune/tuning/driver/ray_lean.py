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
environment, which the agent inherits).

Light on purpose: Ray is imported only when :func:`lean_head` is entered.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["LEAN_ENV", "LEAN_FIELDS", "LEAN_REPORT_MS", "lean_head"]

#: the ``RayParams`` fields of a lean head (each ``ray start`` flag of the same name)
LEAN_FIELDS: dict[str, bool] = {"include_log_monitor": False, "no_monitor": True}
#: a lean node's dashboard agent samples its node's processes this seldom (Ray: 5,000)
LEAN_REPORT_MS = 60_000
#: the environment of a lean node's raylet (and so of its agents)
LEAN_ENV = {"REPORTER_UPDATE_INTERVAL_MS": str(LEAN_REPORT_MS)}

#: one patch of ``Node.__init__`` at a time; re-entrant: a lean head entered inside another
#: (a script run under the tests' ``lean_head`` that starts its Ray through ``start_ray``)
_patching = threading.RLock()


@contextlib.contextmanager
def lean_head(**fields: Any) -> Iterator[None]:
    """While it lasts, a head node started in this process (by ``ray.init``) is a lean one.

    Only a node started as a head changes; a ``ray.init(address=...)`` that joins a cluster
    starts none. Entered from one thread at a time (the others wait): the patch is the
    process's.

    Args:
        fields: More ``RayParams`` fields of the head (e.g. ``include_dashboard=False``).
    """
    from ray._private.node import Node

    with _patching:
        start = Node.__init__

        def lean_start(self: Node, ray_params: Any, *args: Any, head: bool = False, **kw: Any):
            if head:
                ray_params.update(
                    **LEAN_FIELDS, **fields, env_vars={**(ray_params.env_vars or {}), **LEAN_ENV}
                )
            start(self, ray_params, *args, head=head, **kw)

        Node.__init__ = lean_start  # type: ignore[method-assign]
        try:
            yield
        finally:
            Node.__init__ = start  # type: ignore[method-assign]
