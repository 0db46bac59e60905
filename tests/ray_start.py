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

A *lean* Ray — every Ray ``start_ray`` embeds (the product's own,
:mod:`fedtune.tuning.driver.ray_lean`, so :func:`init_ray`'s too), a script's own ``ray.init``
under :func:`lean_head`, or ``LocalRayCluster(..., lean=True)``, whose drivers take no worker logs
(``log_to_driver=False``) and which nothing autoscales — leaves out what only costs CPU there,
one set of settings for all (the product's ``LEAN_FIELDS``, :data:`LEAN_ENV` and ``NO_PRESTART``;
:func:`lean_flags`, :data:`NO_PRESTART_ENV`): no log monitor on any node (it tails every log file
of its node for the drivers, ten times a second), no autoscaler monitor on the head, each node's
dashboard agent samples its node's processes every :data:`LEAN_REPORT_MS` ms instead of every
5 s (``REPORTER_UPDATE_INTERVAL_MS``), and no raylet prestarts idle Python workers (one per
CPU, for its node's first driver; ``start_ray`` sets ``NO_PRESTART`` as system config; ``ray start`` nodes get it as
``RAY_*`` variables). ``ray start`` takes the first two as flags; an in-process
``ray.init`` has no argument for them, so the same fields of the ``RayParams`` its head node
starts from are set (and the raylet's environment, ``RayParams.env_vars``, which its agents
inherit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedtune.tuning.driver import ray_lean
from fedtune.tuning.driver.ray_lean import LEAN_ENV, LEAN_FIELDS, LEAN_REPORT_MS
from fedtune.tuning.driver.ray_runtime import NO_PRESTART, RayStartPolicy, start_ray

__all__ = [
    "LEAN_ENV",
    "LEAN_REPORT_MS",
    "NODE_RETRY_BACKOFF_S",
    "NODE_START_RETRIES",
    "NO_PRESTART_ENV",
    "POLICY",
    "START_RETRIES",
    "START_TIMEOUT_S",
    "init_ray",
    "lean_flags",
    "lean_head",
]

START_TIMEOUT_S = 240
START_RETRIES = 1
NODE_START_RETRIES = 4
NODE_RETRY_BACKOFF_S = 10.0
POLICY = RayStartPolicy(attempts=1 + START_RETRIES, backoff_s=5.0)

#: the product's :data:`~fedtune.tuning.driver.ray_runtime.NO_PRESTART` as the environment of a
#: ``ray start`` node (Ray reads each system setting ``name`` from ``RAY_<name>`` too): its raylet
#: starts no idle Python workers, neither at its start nor when its first driver registers
NO_PRESTART_ENV = {f"RAY_{name}": str(int(value)) for name, value in NO_PRESTART.items()}

#: the lean fields (``LEAN_FIELDS``, each a ``ray start`` flag of its name:
#: ``--include-log-monitor=false``, ``--no-monitor``) that only a head node has a use for
_HEAD_ONLY = ("no_monitor",)


def _fields(head: bool) -> dict[str, bool]:
    return {name: value for name, value in LEAN_FIELDS.items() if head or name not in _HEAD_ONLY}


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


@contextlib.contextmanager
def lean_head(*, dashboard: bool = True) -> Iterator[None]:
    """While it lasts, the head node an in-process ``ray.init`` starts is a lean one (the
    product's :func:`fedtune.tuning.driver.ray_lean.lean_head`), for a script that starts Ray
    itself, not through ``start_ray``.

    Args:
        dashboard: ``False``: the head also starts as ``ray.init(include_dashboard=False)``
            does (its dashboard process without the web UI's modules and their subprocesses),
            for a script that starts Ray with its defaults and calls no dashboard API.
    """
    with ray_lean.lean_head(**({} if dashboard else {"include_dashboard": False})):
        yield


def init_ray(temp_dir: str | Path, **kwargs: Any) -> None:
    """``ray.init(_temp_dir=temp_dir, **kwargs)`` with :data:`POLICY` (one retry): a lean Ray,
    as every Ray ``start_ray`` embeds.

    Args:
        temp_dir: Ray's temp dir (short: unix socket paths).
        **kwargs: ``ray.init``'s arguments.
    """
    start_ray(POLICY, temp_dir=Path(temp_dir), **kwargs)
