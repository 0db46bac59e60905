"""Cheap, crash-safe commits for a study's local SQLite stores (``optuna.db``, ``mlflow.db``).

A study's driver commits ~38 times per trial (Optuna ask/tell and attributes, MLflow runs,
params and metrics): with SQLite's defaults (rollback journal, ``synchronous=FULL``) every
commit waits for several ``fsync`` calls, 0.17 s per trial measured by
``benchmarks/startup.py``'s per-trial profile — most of the per-trial overhead.

:func:`fast_commits` puts a store in write-ahead-log mode and makes every later connection to it
(Optuna's engine, MLflow's engine, a dashboard's) use ``synchronous=NORMAL``: a commit is a
``write`` to the WAL, without an ``fsync``. The guarantees fedtune makes still hold — the service
database makes the same choice (``fedtune.service.db``):

* a committed transaction survives ``kill -9`` of the driver (the operating system has the
  write); only a power loss or an OS crash may roll back the last transactions, and SQLite's WAL
  never leaves a corrupt database;
* readers in other processes (the service, ``optuna-dashboard``, ``mlflow ui``) never block the
  driver and see every committed trial.

WAL needs a shared-memory index beside the file, which network file systems do not provide
(https://sqlite.org/wal.html): a store on NFS, CIFS, Ceph, Lustre, … keeps SQLite's defaults.
``FEDTUNE_SQLITE_WAL=0`` keeps the defaults everywhere, ``=1`` forces WAL.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import unquote

from .. import env

__all__ = [
    "NETWORK_FILESYSTEMS",
    "fast_commits",
    "fast_commits_for",
    "filesystem_type",
    "sqlite_path",
    "wal_allowed",
]

log = logging.getLogger(__name__)

#: file-system types (``/proc/mounts``) whose locking/shared memory WAL cannot rely on
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "9p",
        "afs",
        "gpfs",
        "beegfs",
        "fuse.sshfs",
        "fuse.s3fs",
        "fuse.gcsfuse",
        "fuse.juicefs",
        "ocfs2",
    }
)

#: resolved paths of the stores whose connections get ``synchronous=NORMAL``
_FAST: set[str] = set()
_listening = False


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` URI (None for other stores and in-memory SQLite)."""
    if not uri.startswith("sqlite:///"):
        return None
    path = unquote(uri[len("sqlite:///") :]).split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


def filesystem_type(path: Path, mounts: str = "/proc/mounts") -> str | None:
    """The type of the file system holding ``path`` (longest mount point), None if unknown."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    target, best, kind = str(path.resolve()), -1, None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > best:
            best, kind = len(point), fields[2]
    return kind


def wal_allowed(
    path: Path, environ: Mapping[str, str] | None = None, mounts: str = "/proc/mounts"
) -> bool:
    """WAL for ``path``: ``FEDTUNE_SQLITE_WAL`` if set, else not on a network file system."""
    forced = env.sqlite_wal(environ)
    if forced in ("0", "1"):
        return forced == "1"
    return filesystem_type(path.parent, mounts) not in NETWORK_FILESYSTEMS


def _on_connect(dbapi_connection, _record) -> None:
    """SQLAlchemy pool ``connect`` hook: ``synchronous=NORMAL`` on connections to our stores."""
    if not _FAST or not isinstance(dbapi_connection, sqlite3.Connection):
        return
    rows = dbapi_connection.execute("PRAGMA database_list").fetchall()
    if {str(Path(row[2]).resolve()) for row in rows if row[2]} & _FAST:
        dbapi_connection.execute("PRAGMA synchronous=NORMAL")


def _listen() -> None:
    global _listening
    if not _listening:
        from sqlalchemy import event
        from sqlalchemy.engine import Engine

        event.listen(Engine, "connect", _on_connect)  # every engine, so MLflow's too
        _listening = True


def fast_commits(path: Path, environ: Mapping[str, str] | None = None) -> bool:
    """WAL + ``synchronous=NORMAL`` for the SQLite store at ``path``; False: defaults kept.

    Call it before the engines that use the store connect (connections opened earlier keep
    ``synchronous=FULL``, which is only slower).
    """
    path = Path(path)
    if not wal_allowed(path, environ):
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # a short wait: the switch needs the file to itself, and a store busy with an older
        # study (rollback journal) simply keeps it
        with contextlib.closing(sqlite3.connect(path, timeout=1)) as conn:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    except sqlite3.Error as exc:  # e.g. locked by a reader in rollback mode: defaults kept
        log.info("SQLite store %s keeps its journal mode: %s", path, exc)
        return False
    if str(mode).lower() != "wal":
        return False
    _FAST.add(str(path.resolve()))
    _listen()
    return True


def fast_commits_for(uri: str) -> bool:
    """:func:`fast_commits` for the store a SQLAlchemy/MLflow URI names; False for anything but a
    ``sqlite:///`` file (PostgreSQL, a tracking server, in-memory SQLite)."""
    path = sqlite_path(uri)
    return path is not None and fast_commits(path)
