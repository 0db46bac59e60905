"""Per-round metrics of a study's trials, sent to MLflow by one background thread.

The driver receives a result per trial per report (tens of trials, every round): one
``log_batch`` request per result would make MLflow's REST round trip the driver's limit. The
Tune callback therefore only *queues* a result's metrics (:meth:`RoundLog.add`, no I/O); a
flusher thread waits ``linger`` seconds after the first queued metric, takes everything queued
(all runs), and sends each run's metrics with ``log_batch`` in chunks of at most
:data:`MAX_BATCH` entities, :attr:`RoundLog.SENDERS` runs at once (a request's time is mostly
the server's) — so the number of requests follows the number of *open runs* per ``linger``,
not the number of results. While a batch is being sent the next one accumulates.

Nothing is dropped:

* the queue is bounded (``max_pending`` metrics): :meth:`add` blocks the caller (the Tune
  loop, hence Ray's back-pressure on the trainables; a pack waits for its driver's answer)
  until the flusher has made room. The bound is a few seconds of a busy driver's rounds, so
  MLflow trails the trials by seconds, not minutes, when the trials outrun it;
* :meth:`flush` (one run, or all) returns once every metric queued before the call is stored;
  the tracker calls it before it touches a run otherwise (closing a trial, reconciling runs on
  Ctrl-C or resume, the study's end), so a run is never closed with rounds still queued;
* a failed request (after ``MlflowClient``'s own HTTP retries) keeps its batch queued; its
  error is raised by the next :meth:`add`, while :meth:`flush` first tries again
  (:attr:`RoundLog.RETRIES`) — the end of a study on an overloaded server still stores it.

A copy made by ``pickle`` (Ray Tune pickles its callbacks into the experiment state) is an
empty, idle log on the same client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlflow.entities import Metric

__all__ = ["MAX_BATCH", "RoundLog"]

MAX_BATCH = 1000  # MLflow's limit of entities (metrics + params + tags) per log_batch


class RoundLog:
    """Queue of per-round metrics per run and the thread that sends them (module docstring)."""

    LINGER = 0.5  # seconds the flusher waits for more results before it sends
    MAX_PENDING = 5_000  # metrics queued at most (~1 MB): ~700 rounds of ~7 metrics
    SENDERS = 4  # runs sent at once
    RETRIES, RETRY_S = 3, 2.0  # a flush tries a failed request again after 2, 4, 8 s

    def __init__(
        self, client: Any, linger: float | None = None, max_pending: int | None = None
    ) -> None:
        self.client = client
        self.linger = self.LINGER if linger is None else linger
        self.max_pending = self.MAX_PENDING if max_pending is None else max_pending
        self._setup()

    def _setup(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[str, list[Metric]] = {}
        self._count = 0  # metrics queued, not yet taken by the flusher
        self._sending: set[str] = set()  # runs whose batch is being sent now
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._stop = False
        self.requests = 0  # log_batch calls made (benchmarks read it)

    def __getstate__(self) -> dict[str, Any]:
        return {"client": self.client, "linger": self.linger, "max_pending": self.max_pending}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    # -- the driver's side ------------------------------------------------------------
    def add(self, run_id: str, metrics: Iterable[Metric]) -> None:
        """Queue ``metrics`` of ``run_id``; blocks while ``max_pending`` metrics are queued."""
        items = list(metrics)
        if not items:
            return
        with self._cond:
            self._raise_error()
            while self._count >= self.max_pending:
                self._cond.wait(1.0)
                self._raise_error()
            self._pending.setdefault(run_id, []).extend(items)
            self._count += len(items)
            self._start()
            self._cond.notify_all()

    @property
    def unsent(self) -> int:
        """The metrics queued and not stored yet (a failed request's included)."""
        with self._cond:
            return self._count

    def flush(self, run_id: str | None = None) -> None:
        """Store what is queued for ``run_id`` (every run when None) before returning; a failed
        request is tried again :attr:`RETRIES` times (an overloaded server), then raised."""
        for attempt in range(self.RETRIES + 1):
            try:
                return self._flush(run_id)
            except Exception:  # the rounds stay queued; not KeyboardInterrupt
                if attempt == self.RETRIES:
                    raise
                time.sleep(self.RETRY_S * 2**attempt)

    def _flush(self, run_id: str | None) -> None:
        with self._cond:
            while True:
                self._raise_error()
                runs = set(self._pending) | self._sending
                if run_id is not None:
                    runs &= {run_id}
                if not runs:
                    return
                taken = {
                    r: self._pending.pop(r) for r in runs - self._sending if r in self._pending
                }
                if taken:
                    self._take(taken)
                    break
                self._cond.wait(1.0)  # the flusher is sending that run's batch
        self._send(taken)  # in the caller's thread: it waits for it anyway
        self._flush(run_id)  # what was queued meanwhile (rare)

    def close(self) -> None:
        """Flush everything and stop the thread (a later :meth:`add` starts a new one)."""
        self.flush()
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        with self._cond:
            self._stop = False

    # -- the flusher ----------------------------------------------------------------------
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="fedtune-mlflow-rounds", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop:
                    self._cond.wait()
                deadline = time.monotonic() + self.linger  # let other results join the batch
                while (
                    not self._stop
                    and self._count < self.max_pending
                    and (left := deadline - time.monotonic()) > 0
                ):
                    self._cond.wait(left)
                if self._stop:
                    return
                taken = {
                    r: self._pending.pop(r) for r in list(self._pending) if r not in self._sending
                }
                self._take(taken)
            if taken:
                self._send(taken)

    def _take(self, taken: dict[str, list[Metric]]) -> None:
        """(Under the lock.) Mark ``taken`` as being sent; makes room in the queue."""
        self._sending.update(taken)
        self._count -= sum(len(v) for v in taken.values())
        self._cond.notify_all()

    def _send(self, taken: dict[str, list[Metric]]) -> None:
        """Send each run's metrics, up to :attr:`SENDERS` runs at once (a request's time is
        mostly the server's: concurrent requests, not more CPU, keep up with more runs)."""
        if len(taken) > 1 and self.SENDERS > 1:
            with self._cond:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.SENDERS, "fedtune-mlflow-send")
                pool = self._pool
            list(pool.map(self._send_run, taken.items()))
        else:
            for item in taken.items():
                self._send_run(item)

    def _send_run(self, item: tuple[str, list[Metric]]) -> None:
        run_id, metrics = item
        sent = 0
        try:
            for sent in range(0, len(metrics), MAX_BATCH):
                self.client.log_batch(run_id, metrics=metrics[sent : sent + MAX_BATCH])
                self.requests += 1
        except BaseException as exc:  # kept queued; the driver raises it at its next call
            with self._cond:
                self._error = exc
                rest = metrics[sent:]
                self._pending[run_id] = rest + self._pending.get(run_id, [])
                self._count += len(rest)
        finally:
            with self._cond:
                self._sending.discard(run_id)
                self._cond.notify_all()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error
