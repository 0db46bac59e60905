"""Ray start-up and clean-up for a study's driver (docs/explanation/architecture.md §4, step 2).

* :func:`start_ray` — ``ray.init`` retried: a start-up that fails (the raylet did not register
  within Ray's 30 s on a loaded machine, a cluster that is restarting) is shut down, the
  processes it left in the study's temp dir are reaped, and it is tried again after a backoff
  (``backoff_s · 2^(attempt−1)``), up to :class:`RayStartPolicy` ``attempts``. Then it raises
  :class:`~fedtune.errors.RayStartError`, whose message is one line. An embedded cluster also
  gets a generous worker-registration timeout (:data:`WORKER_REGISTER_TIMEOUT_S`), no
  prestarted idle workers (:data:`NO_PRESTART`) and a lean head: no log monitor and no
  autoscaler monitor (:mod:`.ray_lean`).
* :func:`make_ray_temp_dir` / :func:`ray_temp_dir` — where an embedded Ray keeps its session
  (sockets, logs): the workdir's ``ray/`` when short enough for unix socket paths, else a
  ``/tmp/fedtune-ray-<random>`` folder (:data:`TEMP_PREFIX`, ``mkdtemp``: a name no other user
  can guess or plant first) whose path the workdir's ``ray-temp`` file records, so that a later
  driver or the service finds a killed driver's processes by it. Both are mode 0700 and must be
  real folders owned by this user: Ray's unix sockets and logs are reachable by no one else;
* :func:`reap_orphans` — a driver killed with SIGKILL runs no clean-up: Ray's agents and trial
  workers outlive it (a minute and more, computing). They are found by the study's temp dir:
  a process whose command line names a path inside it or that holds a file open inside it
  (agents and workers rename themselves ``ray::…`` but keep their log files there). Only
  processes of this user and that temp dir are signalled — never another Ray cluster;
* :func:`remove_temp_dir` — a ``/tmp`` temp dir is deleted at the end of the study
  (:func:`discard_temp_dir`: and the workdir's record of it);
* :func:`reap_study` — both, by the service (local backend) once a study's driver is found dead
  and no other driver holds the study's lock: a study that is not run again leaves nothing.

Nothing here imports Ray until :func:`start_ray` runs, so the service can reap without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedtune.errors import ConfigError, RayStartError

from .. import env
from .ray_lean import lean_head

__all__ = [
    "NO_PRESTART",
    "RAY_TEMP_MAX",
    "TEMP_PREFIX",
    "WORKER_REGISTER_TIMEOUT_S",
    "RayStartPolicy",
    "discard_temp_dir",
    "make_ray_temp_dir",
    "ray_temp_dir",
    "reap_orphans",
    "reap_study",
    "remove_temp_dir",
    "start_ray",
]

log = logging.getLogger(__name__)

RAY_TEMP_MAX = 40  # Ray puts unix sockets ~65 characters below its temp dir; Linux allows 107
TEMP_PREFIX = "fedtune-ray-"
SYSTEM_TEMP = Path("/tmp")  # short on purpose (socket paths), whatever TMPDIR says
TEMP_RECORD = "ray-temp"  # in the workdir: the path of its /tmp temp dir
WORKER_REGISTER_TIMEOUT_S = 180  # Ray's default 60 s is too short on a loaded machine
#: an embedded Ray starts no idle Python workers: Ray prestarts one per CPU (each importing Ray,
#: ~1 s of CPU) while the study starts, and Tune's trial actors never use them — they get
#: workers of their own (CPU taken from the start-up of a small study)
NO_PRESTART = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}
_TERM_GRACE_S = 5.0


@dataclass(frozen=True)
class RayStartPolicy:
    """How often :func:`start_ray` tries, and how long it waits before the n-th retry."""

    attempts: int = 3
    backoff_s: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigError("FEDTUNE_RAY_START_ATTEMPTS", f"must be >= 1, got {self.attempts}")
        if not self.backoff_s >= 0:
            raise ConfigError("FEDTUNE_RAY_START_BACKOFF_S", f"must be >= 0, got {self.backoff_s}")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        return self.backoff_s * 2 ** (attempt - 1)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> RayStartPolicy:
        """``FEDTUNE_RAY_START_ATTEMPTS`` / ``FEDTUNE_RAY_START_BACKOFF_S``, else the defaults."""
        values: dict[str, Any] = {}
        for field, var, raw, kind in (
            ("attempts", "FEDTUNE_RAY_START_ATTEMPTS", env.ray_start_attempts(environ), int),
            ("backoff_s", "FEDTUNE_RAY_START_BACKOFF_S", env.ray_start_backoff_s(environ), float),
        ):
            if raw:
                try:
                    values[field] = kind(raw)
                except ValueError:
                    raise ConfigError(var, f"expected a number, got {raw!r}") from None
        return cls(**values)


def start_ray(
    policy: RayStartPolicy | None = None,
    *,
    temp_dir: Path | None = None,
    init: Callable[..., Any] | None = None,
    shutdown: Callable[[], Any] | None = None,
    sleep: Callable[[float], Any] = time.sleep,
    **kwargs: Any,
) -> None:
    """``ray.init(**kwargs)`` (embedded in ``temp_dir`` when given), retried per ``policy``.

    Raises :class:`RayStartError` (one line) when every attempt failed. Argument errors
    (``ValueError``, ``TypeError``) and Ctrl-C are not retried.
    """
    import ray

    policy = policy or RayStartPolicy.from_env()
    init, shutdown = init or ray.init, shutdown or ray.shutdown
    if temp_dir is not None:
        kwargs["_temp_dir"] = str(temp_dir)
        generous = {"worker_register_timeout_seconds": WORKER_REGISTER_TIMEOUT_S, **NO_PRESTART}
        kwargs["_system_config"] = {**generous, **(kwargs.get("_system_config") or {})}
    where = kwargs.get("address") or "embedded"
    if (node := env.ray_node_id()) and kwargs.get("address"):
        _join_node(node)
    for attempt in range(1, policy.attempts + 1):
        try:
            with lean_head() if temp_dir is not None else contextlib.nullcontext():
                init(**kwargs)
            return
        except (ValueError, TypeError):
            raise
        except Exception as exc:
            last = exc
        with contextlib.suppress(Exception):
            shutdown()  # half-started: its processes go, the next attempt starts clean
        if temp_dir is not None:
            reap_orphans(temp_dir, whose=HALF_STARTED)
        if attempt < policy.attempts:
            log.warning(
                "Ray start-up failed (attempt %d of %d): %s; retrying in %.0f s",
                attempt,
                policy.attempts,
                _first_line(last),
                policy.delay(attempt),
            )
            sleep(policy.delay(attempt))
    raise RayStartError(
        f"Ray did not start ({where}) after {policy.attempts} attempt(s): {_first_line(last)}"
    )


def _join_node(node_id: str) -> None:
    """Make ``ray.init`` join node ``node_id`` without looking for its raylet's process.

    Ray's driver finds the node it runs on by the ``--node_id`` of the raylet processes it can
    see (``ray._private.services.find_node_ids``); a driver in a PID namespace of its own (a
    sandbox on a shared head) sees none, and is told the node instead.

    Args:
        node_id: the node's id (hex).
    """
    from ray._private import services

    services.find_node_ids = lambda: [node_id]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


# -- the study's temp dir and what is left in it ------------------------------------------
def ray_temp_dir(workdir: Path) -> Path:
    """The temp dir of the study in ``workdir``: ``<workdir>/ray`` if short enough for Ray's
    unix sockets, else the ``/tmp`` folder the workdir records (:func:`make_ray_temp_dir`);
    without a record, the ``/tmp/fedtune-ray-<hash>`` name of drivers before 0700 random names
    (a killed old driver's processes are still found by it). It may not exist."""
    workdir = Path(workdir)
    inside = workdir / "ray"
    if len(str(inside)) <= RAY_TEMP_MAX:
        return inside
    recorded = _recorded_temp_dir(workdir)
    if recorded is not None:
        return recorded
    digest = hashlib.sha1(str(workdir).encode()).hexdigest()[:10]
    return SYSTEM_TEMP / f"{TEMP_PREFIX}{digest}"


def make_ray_temp_dir(workdir: Path) -> Path:
    """Create (or take back) the study's temp dir, mode 0700, and return it.

    ``<workdir>/ray`` when short enough, else a fresh ``mkdtemp`` folder under ``/tmp`` (random
    name, created 0700 atomically) recorded in ``<workdir>/ray-temp``; an earlier run's
    recorded folder is taken back when it is still a real folder of this user. Anything else at
    that path — a symlink, another user's folder — is refused with a :class:`ConfigError`
    (``ray temp dir``) rather than used: Ray would put its sockets where someone else can reach.
    """
    workdir = Path(workdir)
    inside = workdir / "ray"
    if len(str(inside)) <= RAY_TEMP_MAX:
        inside.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            inside.mkdir(mode=0o700)
        _own_private_dir(inside)
        return inside
    recorded = _recorded_temp_dir(workdir)
    if recorded is not None and recorded.is_dir():
        _own_private_dir(recorded)
        return recorded
    made = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX, dir=SYSTEM_TEMP))
    workdir.mkdir(parents=True, exist_ok=True)
    record = workdir / TEMP_RECORD
    partial = record.with_name(f".{TEMP_RECORD}.{os.getpid()}")
    partial.write_text(str(made))
    os.replace(partial, record)
    return made


def discard_temp_dir(workdir: Path, temp_dir: Path) -> None:
    """:func:`remove_temp_dir` and forget it: the workdir no longer records it."""
    if remove_temp_dir(temp_dir):
        (Path(workdir) / TEMP_RECORD).unlink(missing_ok=True)


def _recorded_temp_dir(workdir: Path) -> Path | None:
    try:
        text = (workdir / TEMP_RECORD).read_text().strip()
    except OSError:
        return None
    path = Path(text)
    if path.parent != SYSTEM_TEMP or not path.name.startswith(TEMP_PREFIX):
        return None  # never act on a record that names anything but our own kind of folder
    return path


def _own_private_dir(path: Path) -> None:
    """``path`` is a real folder of this user (not a symlink): make it 0700, else refuse."""
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise ConfigError(
            "ray temp dir",
            f"{path} is not a folder of this user (a symlink or "
            "another user's): refusing to put Ray's sockets there",
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)


def _inside(text: str, root: str) -> bool:
    """``text`` names ``root`` or a path below it (``root`` followed by '/' or its end)."""
    start = text.find(root)
    while start != -1:
        end = start + len(root)
        if end == len(text) or text[end] == "/":
            return True
        start = text.find(root, start + 1)
    return False


def _start_ticks(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _marked(pid: int, roots: tuple[str, ...]) -> bool:
    proc = Path(f"/proc/{pid}")
    with contextlib.suppress(OSError):
        args = proc.joinpath("cmdline").read_bytes().decode(errors="replace").split("\0")
        if any(_inside(arg, root) for arg in args for root in roots):
            return True
    with contextlib.suppress(OSError):
        for fd in proc.joinpath("fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if any(_inside(target, root) for root in roots):
                    return True
    return False


def _candidates(roots: tuple[str, ...]) -> Iterator[tuple[int, int]]:
    me, uid = os.getpid(), os.getuid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        with contextlib.suppress(OSError):
            if entry.stat().st_uid != uid:
                continue
            ticks = _start_ticks(pid)
            if ticks is not None and _marked(pid, roots):
                yield pid, ticks


#: whose processes :func:`reap_orphans` stops, as its log line says
KILLED_DRIVER = "a killed driver's"
OWN_SHUTDOWN = "outlived this driver's ray.shutdown()"
HALF_STARTED = "a failed Ray start's"
STOPPED_START = "a Ray start this driver stopped"


def reap_orphans(
    temp_dir: Path, grace_s: float = _TERM_GRACE_S, *, whose: str = KILLED_DRIVER
) -> list[int]:
    """Stop every process of this user marked by ``temp_dir`` (SIGTERM, then SIGKILL after
    ``grace_s``); returns their pids. Call it only while no live driver uses ``temp_dir``.

    ``whose`` says where they come from: a warning for a killed driver's (something went wrong
    before), a debug line for stragglers of this driver's own shutdown (routine)."""
    roots = tuple({os.path.abspath(temp_dir), os.path.realpath(temp_dir)})
    found = dict(_candidates(roots))
    if not found:
        return []
    level = logging.DEBUG if whose in (OWN_SHUTDOWN, STOPPED_START) else logging.WARNING
    log.log(
        level,
        "stopping %d Ray process(es) left in %s (%s): pids %s",
        len(found),
        temp_dir,
        whose,
        sorted(found),
    )
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        alive = {p: t for p, t in found.items() if _start_ticks(p) == t}
        for pid in alive:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
                os.kill(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only then
        deadline = time.monotonic() + wait_s
        while alive and time.monotonic() < deadline:
            time.sleep(0.1)
            alive = {p: t for p, t in alive.items() if _start_ticks(p) == t}
        if not alive:
            break
    return sorted(found)


def reap_study(workdir: Path) -> list[int]:
    """The service's clean-up after a study's driver died: reap the Ray processes of the study
    in ``workdir`` and remove its hashed temp dir — unless a live driver holds the study's lock
    (``<workdir>/.lock``, as :func:`fedtune.tuning.driver.study.run_study` takes it). Returns the pids."""
    workdir = Path(workdir)
    if not workdir.is_dir():
        return []
    with (workdir / ".lock").open("a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return []  # a driver runs the study: its processes are not orphans
        try:
            temp = ray_temp_dir(workdir)
            reaped = reap_orphans(temp)
            discard_temp_dir(workdir, temp)
            return reaped
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def remove_temp_dir(temp_dir: Path) -> bool:
    """Delete a ``/tmp/fedtune-ray-*`` temp dir (never anything else); True if removed."""
    temp_dir = Path(temp_dir)
    if temp_dir.parent != SYSTEM_TEMP or not temp_dir.name.startswith(TEMP_PREFIX):
        return False
    shutil.rmtree(temp_dir, ignore_errors=True)
    return not temp_dir.exists()
