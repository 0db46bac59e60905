"""Ray start-up in the tests, one policy for all.

On a loaded machine (load average 13–40 on 2 CPUs) Ray's own start-up waits run out: the raylet
has 30 s to register, workers 60 s. Every Ray the tests start therefore gets a generous timeout
and one retry:

* in-process ``ray.init`` (``tests/integration/conftest.py``): :func:`init_ray` —
  :func:`fedtune.tuning.driver.ray_runtime.start_ray` with :data:`POLICY` (a failed start is shut
  down, its processes reaped, and tried once more; workers get 180 s to register);
* ``ray start`` subprocesses (``tests/service/ray_cluster.py``): :data:`START_TIMEOUT_S` per
  try, :data:`START_RETRIES` retry after stopping what the failed try left. A worker node's
  ``ray start`` gives its raylet a fixed 30 s to register with the head (Ray's
  ``raylet_start_wait_time_s``, not configurable); with two test workers on two loaded CPUs
  that ran out twice in a row (CI, stop 50), so worker nodes get :data:`NODE_START_RETRIES`
  retries, each after :data:`NODE_RETRY_BACKOFF_S` × the attempt's number of seconds;
* drivers the tests run as subprocesses (``fedtune tune``, the service's drivers) use the
  product's own retries (``FEDTUNE_RAY_START_ATTEMPTS``, default 3).

A *lean* Ray — ``init_ray(..., lean=True)`` or ``LocalRayCluster(..., lean=True)``, whose
drivers take no worker logs (``log_to_driver=False``) and which nothing autoscales — leaves out
what only costs CPU there, one set of settings for both (:func:`lean_flags`, :func:`lean_params`,
:data:`LEAN_ENV`): no log monitor on any node (it tails every log file of its node for the
drivers, ten times a second), no autoscaler monitor on the head, and each node's dashboard agent
samples its node's processes every :data:`LEAN_REPORT_MS` ms instead of every 5 s
(``REPORTER_UPDATE_INTERVAL_MS``). ``ray start`` takes the first two as flags; an in-process
``ray.init`` has no argument for them, so :func:`init_ray` sets the same fields of the
``RayParams`` its head node starts from (and the raylet's environment, ``RayParams.env_vars``,
which its agents inherit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

from fedtune.tuning.driver.ray_lean import LEAN_ENV, LEAN_REPORT_MS
from fedtune.tuning.driver.ray_runtime import RayStartPolicy, start_ray

__all__ = [
    "LEAN_ENV",
    "LEAN_REPORT_MS",
    "NODE_RETRY_BACKOFF_S",
    "NODE_START_RETRIES",
    "POLICY",
    "START_RETRIES",
    "START_TIMEOUT_S",
    "init_ray",
    "lean_flags",
    "lean_head",
    "lean_params",
]

START_TIMEOUT_S = 240
START_RETRIES = 1
NODE_START_RETRIES = 4
NODE_RETRY_BACKOFF_S = 10.0
POLICY = RayStartPolicy(attempts=1 + START_RETRIES, backoff_s=5.0)

#: ``LEAN_REPORT_MS`` and ``LEAN_ENV`` are the product's own (``fedtune.tuning.driver.ray_lean``:
#: every embedded Ray a study's driver starts is lean)

#: what a lean node leaves out: ``(RayParams field, its value, head only)``; ``ray start`` has
#: a flag of the field's name (``--include-log-monitor=false``, ``--no-monitor``) for each
_LEAN = (
    ("include_log_monitor", False, False),
    ("no_monitor", True, True),
)


def _fields(head: bool) -> dict[str, bool]:
    return {name: value for name, value, head_only in _LEAN if head or not head_only}


def lean_flags(*, head: bool) -> list[str]:
    """The ``ray start`` flags of a lean head (``head``) or worker node.

    Args:
        head: Whether the node is the head (the only one with an autoscaler monitor).

    Returns:
        The flags, to add to ``ray start``'s.
    """
    return [
        "--" + name.replace("_", "-") + ("" if value is True else f"={str(value).lower()}")
        for name, value in _fields(head).items()
    ]


def lean_params(*, head: bool) -> dict[str, Any]:
    """The ``RayParams`` fields those flags set, and the raylet's environment (:data:`LEAN_ENV`).

    Args:
        head: Whether the node is the head.

    Returns:
        ``{field: value}`` for ``RayParams.update``.
    """
    return {**_fields(head), "env_vars": dict(LEAN_ENV)}


@contextlib.contextmanager
def lean_head(*, dashboard: bool = True) -> Iterator[None]:
    """While it lasts, the head node an in-process ``ray.init`` starts is a lean one.

    ``ray.init`` builds its head node's ``RayParams`` itself and offers none of the fields
    :func:`lean_params` sets; they are set on the way into ``ray._private.node.Node``.

    Args:
        dashboard: ``False``: the head also starts as ``ray.init(include_dashboard=False)``
            does (its dashboard process without the web UI's modules and their subprocesses),
            for a script that starts Ray with its defaults and calls no dashboard API.
    """
    from ray._private.node import Node

    start = Node.__init__
    extra = {} if dashboard else {"include_dashboard": False}

    def lean_start(self: Node, ray_params: Any, *args: Any, head: bool = False, **kw: Any) -> None:
        if head:
            ray_params.update(**lean_params(head=True), **extra)
        start(self, ray_params, *args, head=head, **kw)

    with mock.patch.object(Node, "__init__", lean_start):
        yield


def init_ray(temp_dir: str | Path, *, lean: bool = False, **kwargs: Any) -> None:
    """``ray.init(_temp_dir=temp_dir, **kwargs)`` with :data:`POLICY` (one retry).

    Args:
        temp_dir: Ray's temp dir (short: unix socket paths).
        lean: Start a lean Ray (the module's docstring): for drivers with
            ``log_to_driver=False`` that read no node metrics and need no autoscaler.
        **kwargs: ``ray.init``'s arguments.
    """
    import ray

    def init(**kw: Any) -> None:
        with lean_head() if lean else contextlib.nullcontext():
            ray.init(**kw)

    start_ray(POLICY, temp_dir=Path(temp_dir), init=init, **kwargs)
