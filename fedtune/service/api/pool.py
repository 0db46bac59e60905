"""Submissions are validated in a small pool of their own, never on the request thread pool.

Validating a study (``accept_spec``: the search space, the recipe, a bound of each parameter,
a cheap check per choice) or checking uploaded code (a subprocess) takes CPU for milliseconds to
seconds, so ``POST /v1/studies`` hands it to ``FEDTUNE_MAX_CONCURRENT_VALIDATIONS`` dedicated
threads; up to ``FEDTUNE_VALIDATION_QUEUE`` more wait for a thread without holding one of the
server's. Beyond that the request is answered at once with 503 ``busy`` and ``Retry-After: 1``
(the SDK retries it with backoff): a burst of heavy submissions cannot take the threads that serve
reads, health and readiness. A place is released when its validation finishes, even if the
client has gone.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..errors import ServiceBusyError

__all__ = ["ValidationPool"]

T = TypeVar("T")


class ValidationPool:
    def __init__(self, slots: int, queue: int = 0) -> None:
        self.slots, self.queue = slots, queue
        self._free = threading.BoundedSemaphore(slots + queue)
        self._executor = ThreadPoolExecutor(
            max_workers=slots, thread_name_prefix="fedtune-validate"
        )

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a pool thread; ``ServiceBusyError`` when slots and queue are full."""
        if not self._free.acquire(blocking=False):
            raise ServiceBusyError(
                f"{self.slots} submissions are being validated and {self.queue} wait "
                "(FEDTUNE_MAX_CONCURRENT_VALIDATIONS, FEDTUNE_VALIDATION_QUEUE); retry shortly"
            )
        try:
            future = self._executor.submit(fn, *args)
        except BaseException:
            self._free.release()
            raise
        future.add_done_callback(lambda _: self._free.release())
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
