"""One scheduler per database, whatever the number of API replicas.

Every replica serves the API; exactly one runs the scheduler's tick — the *leader*:

* **PostgreSQL** — :class:`DatabaseLease`: a lease row (``scheduler_lease``, name
  ``scheduler``) with a holder, an expiry and a **fencing token** that grows by one at every new
  holder. A replica renews its lease at every tick (``FEDTUNE_LEADER_LEASE_S``, default 10 s,
  must exceed the tick interval); when the holder stops renewing (killed, partitioned, paused)
  another replica takes the expired lease over with token + 1 within one lease period. Every
  state change the scheduler makes (claiming a study for dispatch, re-queueing or failing one
  whose driver is gone, putting back one whose launch failed) is fenced: its ``UPDATE`` holds
  only while ``scheduler_lease`` still names this holder *and* token, unexpired
  (:func:`fence_clause`) — a deposed leader that wakes up cannot dispatch anything twice.
* **SQLite** — one process only: :class:`ProcessLock` takes an exclusive ``flock`` on
  ``<database>.scheduler.lock``; a second ``fedtune serve`` on the same file serves the API but
  refuses to run a scheduler, with one line saying so.

``/metrics`` exports ``fedtune_scheduler_leader`` (1 on the leader, 0 elsewhere).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import logging
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import and_, exists, select
from sqlalchemy.sql.elements import ColumnElement

from fedtune.errors import FedtuneError

from .db import Database
from .models import SchedulerLease, utcnow

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "LEASE",
    "DatabaseLease",
    "Fence",
    "Leadership",
    "ProcessLock",
    "fence_clause",
    "make_leadership",
]

log = logging.getLogger(__name__)
LEASE = "scheduler"


@dataclass(frozen=True)
class Fence:
    """Who leads, with which fencing token (``token`` 0: a process lock, nothing to fence)."""

    holder: str
    token: int


class Leadership(Protocol):
    def hold(self) -> Fence | None:
        """Become or stay the leader; the fence while leading, else None."""

    def release(self) -> None: ...


def holder_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class DatabaseLease:
    """The PostgreSQL lease (see the module docstring)."""

    def __init__(self, db: Database, lease_s: float, holder: str | None = None) -> None:
        self.db, self.lease_s = db, lease_s
        self.holder = holder or holder_id()
        self.fence: Fence | None = None

    def hold(self) -> Fence | None:
        try:
            self.fence = self._hold()
        except FedtuneError as exc:  # the database is unreachable: lead nothing meanwhile
            log.warning("scheduler lease not renewed: %s", exc)
            self.fence = None
        return self.fence

    def _hold(self) -> Fence | None:
        now = utcnow()
        until = now + dt.timedelta(seconds=self.lease_s)
        with self.db.session() as session:
            row = session.scalars(
                select(SchedulerLease).where(SchedulerLease.name == LEASE).with_for_update()
            ).first()
            if row is None:
                session.add(
                    SchedulerLease(
                        name=LEASE, holder=self.holder, token=1, expires_at=until, renewed_at=now
                    )
                )
                token = 1
            elif row.holder == self.holder and row.expires_at is not None and row.expires_at > now:
                row.expires_at, row.renewed_at = until, now
                token = row.token
            elif row.holder is None or row.expires_at is None or row.expires_at <= now:
                row.holder, row.token = self.holder, row.token + 1
                row.expires_at, row.renewed_at = until, now
                token = row.token
                log.warning("scheduler leader: %s (fencing token %d)", self.holder, token)
            else:
                return None
        return Fence(self.holder, token)

    def release(self) -> None:
        """Give the lease up at shutdown, so another replica takes over at once."""
        with contextlib.suppress(FedtuneError), self.db.session() as session:
            row = session.scalars(
                select(SchedulerLease)
                .where(SchedulerLease.name == LEASE, SchedulerLease.holder == self.holder)
                .with_for_update()
            ).first()
            if row is not None:
                row.holder, row.expires_at = None, utcnow()


class ProcessLock:
    """SQLite: an exclusive lock file held for the life of the process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh: Any = None
        self.refused = False

    def hold(self) -> Fence | None:
        if self._fh is not None:
            return Fence("process", 0)
        if self.refused:
            return None
        fh = self.path.open("a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            self.refused = True
            log.error(
                "scheduler not started: another process runs the scheduler of this SQLite "
                "database (%s); SQLite is single-process: use PostgreSQL for several "
                "replicas",
                self.path,
            )
            return None
        self._fh = fh
        return Fence("process", 0)

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def make_leadership(db: Database, settings: Settings) -> Leadership | None:
    """A lease on PostgreSQL, a lock file beside a SQLite file, nothing for in-memory SQLite."""
    if db.dialect == "postgresql":
        return DatabaseLease(db, settings.leader_lease_s)
    database = db.engine.url.database
    if db.dialect == "sqlite" and database and database != ":memory:":
        return ProcessLock(Path(f"{database}.scheduler.lock"))
    return None


def fence_clause(fence: Fence | None) -> ColumnElement[bool] | None:
    """The condition a fenced ``UPDATE`` adds: the lease still names this holder and token."""
    if fence is None or fence.token == 0:
        return None
    return exists(
        select(SchedulerLease.name).where(
            and_(
                SchedulerLease.name == LEASE,
                SchedulerLease.holder == fence.holder,
                SchedulerLease.token == fence.token,
                SchedulerLease.expires_at > utcnow(),
            )
        )
    )
