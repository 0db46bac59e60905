"""Whether the execution backend can be used at all, and why not.

A backend that refuses the service's credentials (a Ray cluster with token authentication and no
``RAY_AUTH_TOKEN``) or that nothing answers for (a wrong ``RAY_ADDRESS``) fails every study's
launch the same way. :class:`BackendHealth` turns those failures into one state of the service:

* ``up`` — the backend answered its last call (or has nothing to reach);
* ``down`` with a reason — ``authentication failed: ...`` (HTTP 401/403:
  :class:`~.backends.base.BackendAuthError`) or ``unreachable: ...``
  (:class:`~.backends.base.BackendUnreachableError`); other backend errors concern one driver
  and leave the state as it is.

Each change of state is logged once (up → down, down → up, refused → unreachable and back),
never once per study and tick (the wording of a reason may differ between calls; the kind of
reason is what counts). The scheduler feeds it (launch, poll, and a ``Backend.check`` probe while
down, so that no study is claimed for nothing); ``/readyz`` and the ``fedtune_backend_up``
gauge read it, probing the backend themselves when nothing fed it for ``max_age_s`` (a replica
that does not lead the scheduler). While the backend is down each queued study keeps ``queued``
with :attr:`BackendHealth.queued_reason`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from fedtune.errors import BackendError

from .backends.base import Backend, BackendAuthError, BackendUnreachableError

__all__ = ["BackendHealth", "HealthState", "unusable_reason"]

log = logging.getLogger(__name__)

#: how old an observation may be before a reader (``/readyz``, a scrape) probes again
MAX_AGE_S = 30.0
#: how long a reader waits for that probe (``/readyz`` answers within its probe's timeout)
PROBE_WAIT_S = 1.0


@dataclass(frozen=True)
class HealthState:
    """What is known of the backend: ``up`` (None: never observed) and, when down, why."""

    up: bool | None
    reason: str | None = None
    observed_at: float | None = None  # monotonic time of the last observation


def unusable_reason(exc: BaseException) -> str | None:
    """Why ``exc`` makes the whole backend unusable, in one line; None when it does not.

    Args:
        exc: an error a backend raised.

    Returns:
        ``authentication failed: ...`` or ``unreachable: ...``; None for any other error.
    """
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if isinstance(exc, BackendAuthError):
        return f"authentication failed: {first}"
    if isinstance(exc, BackendUnreachableError):
        return f"unreachable: {first}"
    return None


class BackendHealth:
    """The backend's state as the service last observed it (see the module docstring)."""

    def __init__(self, backend: Backend, clock: Callable[[], float] = time.monotonic) -> None:
        self.backend = backend
        self.kind = str(backend.kind)
        self._clock = clock
        self._lock = threading.Lock()
        self._state = HealthState(up=None)
        self._probing: threading.Thread | None = None

    @property
    def state(self) -> HealthState:
        """The last observation (no probe)."""
        return self._state

    @property
    def down(self) -> bool:
        return self._state.up is False

    @property
    def queued_reason(self) -> str:
        """What a study waiting because of it shows (``GET /v1/studies/{id}``)."""
        return f"backend {self.kind!r} unusable: {self._state.reason}"

    def answered(self) -> None:
        """The backend answered a call: it is up."""
        self._set(True, None)

    def failed(self, exc: BaseException) -> bool:
        """A backend call raised ``exc``; True when that makes the backend down (then the caller
        logs nothing more: the change of state is logged here, once)."""
        reason = unusable_reason(exc)
        if reason is None:
            return False
        self._set(False, reason)
        return True

    def probe(self) -> bool:
        """``Backend.check()`` now; True when the backend is usable."""
        try:
            self.backend.check()
        except BackendError as exc:
            if not self.failed(exc):  # some other answer: it is reachable and we got in
                self.answered()
            return not self.down
        self.answered()
        return True

    def current(self, max_age_s: float = MAX_AGE_S, wait_s: float = PROBE_WAIT_S) -> HealthState:
        """The state, probed first when nothing was observed for ``max_age_s`` seconds.

        Args:
            max_age_s: how old the last observation may be.
            wait_s: how long to wait for that probe (it runs in a thread of its own, one at a
                time: a backend that answers slowly never holds ``/readyz`` past its probe's
                timeout; the state found then is answered, the probe's result is kept).

        Returns:
            The state known after the probe, or after ``wait_s``.
        """
        seen = self._state.observed_at
        if seen is None or self._clock() - seen > max_age_s:
            with self._lock:
                probe = self._probing
                if probe is None or not probe.is_alive():
                    probe = threading.Thread(
                        target=self.probe, name="fedtune-backend-probe", daemon=True
                    )
                    self._probing = probe
                    probe.start()
            probe.join(wait_s)
        return self._state

    def _set(self, up: bool, reason: str | None) -> None:
        with self._lock:
            before = self._state
            self._state = HealthState(up, reason, self._clock())
        if before.up == up and _kind(before.reason) == _kind(reason):
            return
        if not up:
            log.error(
                "backend %r unusable: %s; studies stay queued until it is fixed", self.kind, reason
            )
        elif before.up is False:
            log.warning("backend %r usable again", self.kind)


def _kind(reason: str | None) -> str | None:
    """``authentication failed`` or ``unreachable``: the part of a reason before its details."""
    return reason.split(":", 1)[0] if reason else None
