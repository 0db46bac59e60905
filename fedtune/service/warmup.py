"""Warm start: load the tuning stack once at start-up, off the request path.

Validating a submission needs :mod:`fedtune.tuning.spec` and, through it, the engine's
registries, the search spaces and pydantic's compiled validators: seconds of imports on an idle
machine and a minute on a loaded one. Left to the first request, that request paid it (and held a
worker thread meanwhile). :class:`Warmup` does it in a thread started by the app's lifespan, by
validating one small study exactly as a submission would; ``/readyz`` answers 503
``warming_up`` until it has finished, so a load balancer sends no submission before it is fast.
"""

from __future__ import annotations

import logging
import threading
import time

__all__ = ["WARM_SPEC", "Warmup"]

log = logging.getLogger(__name__)

#: the study validated at start (what a first submission would make the service import)
WARM_SPEC = {
    "name": "warmup",
    "task": {"name": "quadratic", "clients": 4, "dim": 2},
    "algorithm": "fedavg",
    "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 1, "batch_size": 2},
    "objective": {"last_rounds": 1},
    "scheduler": {"name": "none"},
    "budget": {"trials": 1},
}


class Warmup(threading.Thread):
    """Validate :data:`WARM_SPEC` once; ``done`` is set when finished (even on error)."""

    def __init__(self) -> None:
        super().__init__(name="fedtune-warmup", daemon=True)
        self.done = threading.Event()
        self.seconds: float | None = None
        self.error: str | None = None

    def run(self) -> None:
        from .specs import accept_spec

        start = time.perf_counter()
        try:
            accept_spec(dict(WARM_SPEC))
        except Exception as exc:  # never keep the service unready over a warm-up problem
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("warm-up failed (submissions will load lazily): %s", self.error)
        finally:
            self.seconds = time.perf_counter() - start
            self.done.set()
            log.info("tuning stack loaded in %.2f s", self.seconds)
