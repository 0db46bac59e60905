"""A study's process plumbing: its lock, its Ray, and Ray started early.

* :func:`study_lock` — one driver per study: an exclusive ``flock`` on ``<workdir>/.lock``
  (the owner's pid written in it); a second driver gets :class:`~fedtune.errors.ConflictError`.
* :func:`ray_session` — Ray for one invocation: the caller's if it already runs, a cluster's
  (``address``), or an embedded one in the study's temp dir (:func:`.ray_runtime.ray_temp_dir`),
  whose stragglers are reaped before and after.
* :class:`EarlyRay` — the embedded Ray started in a background thread
  (:class:`.ray_thread.RayThread`, whose start can be stopped) *before* the caller imports the
  engine and validates the spec (``fedtune tune``'s fixed start-up).
  Those imports (torch, Ray Tune, Optuna) take seconds of CPU in the main thread while Ray's
  start is mostly waiting on its GCS and raylet processes, so the two overlap. It takes the
  study lock first, so it never touches a temp dir another driver uses, and hands both the
  lock and Ray to :func:`~fedtune.tuning.driver.study.run_study`.

Light on purpose: Ray is imported inside the functions (by the early thread, not the caller).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedtune.errors import ConflictError

from .ray_runtime import (
    OWN_SHUTDOWN,
    STOPPED_START,
    discard_temp_dir,
    make_ray_temp_dir,
    ray_temp_dir,
    reap_orphans,
    start_ray,
)
from .ray_thread import RayStartAborted, RayThread

__all__ = ["OBJECT_STORE_BYTES", "EarlyRay", "ray_session", "study_lock"]

OBJECT_STORE_BYTES = 256 * 1024**2  # trials exchange only small results


@contextlib.contextmanager
def study_lock(workdir: Path) -> Iterator[None]:
    """Hold the study's lock (``ConflictError`` naming the owner's pid when another holds it)."""
    with (Path(workdir) / ".lock").open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            owner = fh.read().strip() or "?"
            raise ConflictError(
                f"{workdir}: another driver (pid {owner}) runs this study"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        yield


@contextlib.contextmanager
def ray_session(
    workdir: Path, address: str | None, runtime_env: dict[str, Any] | None = None
) -> Iterator[bool]:
    """Ray for one invocation (the study lock is held: no other driver uses its temp dir);
    yields whether ``runtime_env`` (the study's code) is the job's."""
    import ray

    if ray.is_initialized():  # the caller's Ray: use it, leave it running
        yield False
        return
    quiet: dict[str, Any] = {"logging_level": logging.ERROR, "log_to_driver": False}
    if runtime_env:
        quiet["runtime_env"] = runtime_env
    if address:
        start_ray(address=address, **quiet)
        try:
            yield bool(runtime_env)
        finally:
            ray.shutdown()
        return
    reap_orphans(ray_temp_dir(workdir))  # agents and workers of a driver killed with SIGKILL
    temp = make_ray_temp_dir(workdir)
    try:
        start_ray(
            temp_dir=temp,
            num_cpus=len(os.sched_getaffinity(0)),
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            **quiet,
        )
        try:
            yield bool(runtime_env)
        finally:
            ray.shutdown()
    except RayStartAborted:  # a start stopped half-way: its processes have nothing to keep
        reap_orphans(temp, grace_s=0.0, whose=STOPPED_START)
        raise
    finally:
        # stragglers of a shutdown that did not wait for every agent: routine, not a warning
        reap_orphans(temp, whose=OWN_SHUTDOWN)
        discard_temp_dir(workdir, temp)


class EarlyRay(RayThread):
    """An embedded Ray starting in a thread while the caller does the rest of its start-up.

    :meth:`begin` takes the study lock and starts the thread (None when another driver holds
    the lock: ``run_study`` then reports the conflict as usual). :meth:`ready` waits for Ray and
    re-raises its start-up error (a one-line ``RayStartError``). :meth:`stop_ray` shuts Ray down,
    or stops its start if it is still starting (:class:`.ray_thread.RayThread`: a spec error, a
    task that cannot be built or a study whose trials run in the driver does not wait for Ray's
    start), and :meth:`close` then also releases the lock. Both are idempotent, so the caller
    closes it in a ``finally`` whatever ``run_study`` did. Unless ``run_study`` :meth:`claim` ed
    it, closing also removes the lock file and the directories :meth:`begin` made: a spec that
    fails validation leaves no workdir behind, as without the early start.

    The thread lives until Ray is shut down, and shuts it down itself (:mod:`.ray_thread`). The
    SIGTERM handler that ``ray.init`` installs only from the main thread is not installed:
    SIGTERM keeps its default (the process ends).
    """

    def __init__(self, workdir: Path) -> None:
        super().__init__(Path(workdir).resolve(), marks=("early_ray", "early_ray_ready"))
        self._lock_file = contextlib.ExitStack()
        self._created: list[Path] = []  # directories begin() made, deepest first
        self.claimed = False  # run_study took it: the workdir is the study's now

    @classmethod
    def begin(cls, workdir: Path) -> EarlyRay | None:
        early = cls(workdir)
        missing = [d for d in (early.workdir, *early.workdir.parents) if not d.exists()]
        early.workdir.mkdir(parents=True, exist_ok=True)
        early._created = missing
        try:
            early._lock_file.enter_context(study_lock(early.workdir))
        except ConflictError:
            return None
        early.start()
        return early

    def stop_ray(self) -> None:
        """Shut Ray down, or stop its start, and wait for it (:meth:`.RayThread.stop`)."""
        self.stop()

    def claim(self) -> EarlyRay:
        """``run_study`` takes the lock and Ray: the workdir is kept whatever happens next."""
        self.claimed = True
        return self

    def close(self) -> None:
        try:
            self.stop_ray()
        finally:
            if not self.claimed:  # the study never started (a spec error): leave no trace
                (self.workdir / ".lock").unlink(missing_ok=True)
            self._lock_file.close()
            if not self.claimed:
                for d in self._created:
                    with contextlib.suppress(OSError):  # not empty: someone else's now
                        d.rmdir()
            self._created = []
