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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedtune.tuning.driver.ray_runtime import RayStartPolicy, start_ray

__all__ = [
    "NODE_RETRY_BACKOFF_S",
    "NODE_START_RETRIES",
    "POLICY",
    "START_RETRIES",
    "START_TIMEOUT_S",
    "init_ray",
]

START_TIMEOUT_S = 240
START_RETRIES = 1
NODE_START_RETRIES = 4
NODE_RETRY_BACKOFF_S = 10.0
POLICY = RayStartPolicy(attempts=1 + START_RETRIES, backoff_s=5.0)


def init_ray(temp_dir: str | Path, **kwargs: Any) -> None:
    """``ray.init(_temp_dir=temp_dir, **kwargs)`` with :data:`POLICY` (one retry)."""
    start_ray(POLICY, temp_dir=Path(temp_dir), **kwargs)
