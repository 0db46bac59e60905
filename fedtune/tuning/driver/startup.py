"""A study's concurrent start-up work, behind one handle.

:class:`Startup` runs work in its own threads and owns them and their results; each piece of
work is named by a :class:`Deferred`, which waits for its result. A ``Deferred`` holds only two
names, no thread and no future, so whatever holds one pickles as it is (Ray Tune pickles its
callbacks). :func:`import_soon` imports a module in a background thread.
See ``docs/explanation/architecture.md §4`` for how a study's start-up overlaps.
"""

from __future__ import annotations

import importlib
import threading
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

__all__ = ["Deferred", "Startup", "import_soon"]

T = TypeVar("T")
U = TypeVar("U")

#: the start-ups of this process that are still referenced, by token
_STARTUPS: weakref.WeakValueDictionary[str, Startup] = weakref.WeakValueDictionary()


@dataclass(frozen=True)
class Deferred(Generic[T]):
    """The result of one piece of a :class:`Startup`'s work, once it is ready.

    Args:
        startup: The token of the start-up that runs the work.
        index: The work's position in that start-up.
    """

    startup: str
    index: int

    def result(self, timeout: float | None = None) -> T:
        """Wait for the work's result.

        Args:
            timeout: Seconds to wait at most (None: as long as it takes).

        Returns:
            What the work returned.

        Raises:
            LookupError: The start-up is not this process's (a pickled copy) or is gone.
            concurrent.futures.CancelledError: The work was cancelled before it began.
            Exception: The error the work raised.
        """
        return self._future().result(timeout)

    def done(self) -> bool:
        """Whether the work has finished (returned, raised or been cancelled).

        Returns:
            True once the work has ended.
        """
        return self._future().done()

    def check(self) -> None:
        """Raise the work's error if it has already failed; wait for nothing.

        Raises:
            Exception: The error the work raised, when it has ended with one.
        """
        future = self._future()
        if future.done():
            future.result()

    def _future(self) -> Future[T]:
        startup = _STARTUPS.get(self.startup)
        if startup is None:
            raise LookupError(f"start-up {self.startup} is not running in this process")
        return startup._futures[self.index]


class Startup:
    """Threads that run a study's start-up work concurrently, and that work's results.

    Use it as a context manager: on leaving, its threads are joined; when the block raised,
    work that has not begun is cancelled first. Results stay readable as long as the
    ``Startup`` is referenced.

    Args:
        name: The threads' name prefix (``<name>_0``, ``<name>_1`` …).
        workers: The most pieces of work run at once.
    """

    def __init__(self, name: str = "fedtune-startup", workers: int = 3) -> None:
        self._pool = ThreadPoolExecutor(workers, name)
        self._futures: list[Future[Any]] = []
        self._lock = threading.Lock()
        self.token = uuid.uuid4().hex
        _STARTUPS[self.token] = self

    def submit(self, fn: Callable[..., T], *args: Any, inline: bool = False) -> Deferred[T]:
        """Run ``fn(*args)`` in one of the threads (or here and now).

        Args:
            fn: The work.
            *args: Its arguments.
            inline: Run it in the caller's thread before returning; its error is raised here.

        Returns:
            The handle of its result.
        """
        if inline:
            future: Future[T] = Future()
            future.set_result(fn(*args))
        else:
            future = self._pool.submit(fn, *args)
        with self._lock:
            self._futures.append(future)
            return Deferred(self.token, len(self._futures) - 1)

    def known(self, value: T) -> Deferred[T]:
        """The handle of a result known already (work done before the start-up began).

        Args:
            value: The result.

        Returns:
            Its handle, ready at once.
        """
        return self.submit(lambda: value, inline=True)

    def then(self, first: Deferred[U], fn: Callable[..., T], *args: Any) -> Deferred[T]:
        """Run ``fn(first's result, *args)`` in one of the threads once ``first`` is ready.

        Args:
            first: The work whose result ``fn`` takes.
            fn: The work.
            *args: Its further arguments.

        Returns:
            The handle of its result (``first``'s error, if ``first`` failed).
        """
        return self.submit(lambda: fn(first.result(), *args))

    def on_error(self, handle: Deferred[Any], fn: Callable[[BaseException], Any]) -> None:
        """Call ``fn(error)`` as soon as the work ``handle`` names fails (in the thread that ran
        it; here and now if it has failed already); nothing when it succeeds or is cancelled.

        Args:
            handle: The work.
            fn: What to do with its error.
        """

        def failed(future: Future[Any]) -> None:
            if not future.cancelled() and future.exception() is not None:
                fn(future.exception())

        handle._future().add_done_callback(failed)

    def close(self, cancel: bool = False) -> None:
        """Join the threads (idempotent).

        Args:
            cancel: Cancel the work that has not begun yet (after a failure).
        """
        self._pool.shutdown(wait=True, cancel_futures=cancel)

    def __enter__(self) -> Startup:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(cancel=exc is not None)


def import_soon(module: str) -> None:
    """Import ``module`` in a daemon thread; whoever imports it next waits for that import.

    Args:
        module: The module's full name.
    """
    threading.Thread(
        target=importlib.import_module,
        args=(module,),
        name=f"fedtune-import-{module.rsplit('.', 1)[-1]}",
        daemon=True,
    ).start()
