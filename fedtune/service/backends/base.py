"""The backend interface: where a study's driver (``fedtune worker run-study ID``) runs.

Narrow on purpose (Optuna's sampler/pruner lesson): three required methods and a no-op hook.

* ``launch(request) -> ref`` starts the driver of one dispatch attempt and returns a
  JSON-serialisable reference (stored in ``studies.driver_ref``, so a restarted service can
  find the driver again);
* ``poll(ref) -> DriverStatus`` says whether that driver is still alive and how it ended;
  ``GONE`` means the backend has no trace of it (killed, node lost, object deleted);
* ``stop(ref)`` stops it and everything it started (idempotent; a driver already gone is fine);
* ``close()`` releases clients;
* ``describe(ref)`` (optional) says why the driver is in the state the last ``poll`` saw (a
  RayJob's ``status.reason``/``message``), recorded with the study's error;
* ``exit_info(ref)`` (optional) says how a failed driver ended: its exit status and the last
  error line it wrote (a Ray job's log, the local driver's log file, a RayJob's message); the
  reconciliation puts that line in the study's error and, when the status is a permanent one
  (:func:`fedtune.service.faults.permanent_exit`), fails the study without another attempt;
* ``check()`` (optional) raises when the backend cannot be used at all: ``BackendAuthError``
  (the credentials were refused) or ``BackendUnreachableError`` (nothing answers);
* ``release(ref)`` (optional, for backends with ``keeps_finished``) deletes what the backend
  keeps of a finished driver (a RayJob object); the scheduler calls it once the study is final
  and clears ``driver_ref`` when it returns True.

A backend raises ``BackendError`` when it cannot tell (API unreachable); the scheduler then
leaves the study as it is and asks again on its next tick. The two subclasses that mean "the
backend is unusable, whatever the study" — ``BackendAuthError`` and ``BackendUnreachableError``
— mark the backend down (:mod:`fedtune.service.backend_health`) instead of failing a study.
"""

from __future__ import annotations

import abc
import enum
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from fedtune.errors import BackendError

from ..settings import BackendKind

__all__ = [
    "Backend",
    "BackendAuthError",
    "BackendUnreachableError",
    "DriverExit",
    "DriverStatus",
    "LaunchRequest",
    "check_study_id",
    "driver_argv",
    "last_error_line",
    "python_driver_argv",
]

_STUDY_ID = re.compile(r"^[0-9a-f]{12}$")
#: a line that reads as an error: ``... error ...``, ``XyzError: ...``, ``sh: 1: x: not found``
_ERROR_LINE = re.compile(r"(?i)error|exception|not found|denied|refused|fatal|traceback")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: the longest last error line kept (it goes into the study's error)
MAX_LINE = 500


class BackendAuthError(BackendError):
    """The backend refused the service's credentials (HTTP 401/403): no study can be launched
    until they are fixed."""


class BackendUnreachableError(BackendError):
    """Nothing answers at the backend's address (connection refused, timed out, DNS)."""


@dataclass(frozen=True)
class DriverExit:
    """How a driver that failed ended, as far as its backend can tell."""

    code: int | None = None  # its exit status (None: unknown)
    last_line: str | None = None  # the last error line it wrote (None: none found)


def last_error_line(text: str | None) -> str | None:
    """The last line of a driver's output that reads as an error, else its last non-empty line.

    Args:
        text: the driver's output (stdout and stderr), or its tail.

    Returns:
        That line, stripped and cut to ``MAX_LINE`` characters; None when ``text`` has none.
    """
    lines = [ln.strip() for ln in _ANSI.sub("", text or "").splitlines() if ln.strip()]
    if not lines:
        return None
    line = next((ln for ln in reversed(lines) if _ERROR_LINE.search(ln)), lines[-1])
    return line[:MAX_LINE]


class DriverStatus(enum.StrEnum):
    PENDING = "pending"  # accepted, not started yet (pods scheduling, job queued)
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # exited 0
    FAILED = "failed"  # exited non-zero, stopped, or its deadline passed
    GONE = "gone"  # the backend has no trace of it

    @property
    def alive(self) -> bool:
        return self in (DriverStatus.PENDING, DriverStatus.RUNNING)


@dataclass(frozen=True)
class LaunchRequest:
    """One dispatch attempt of a study, with the resources its trial processes need and the
    driver's one-time start ticket (never shown: ``repr`` leaves it out).

    A trial process trains one configuration, or several for a packed study
    (``resources.pack``): ``processes`` (0: one per configuration, ``max_concurrent``) is how
    many run at once, each holding ``cpu`` and ``gpu``.
    """

    study_id: str
    attempt: int
    cpu: float = 1.0  # per trial process
    gpu: float = 0.0  # per trial process
    max_concurrent: int = 1  # configurations at once (budget.max_concurrent)
    code_sha256: str | None = None  # the study's uploaded code package, if any
    project: str = "default"  # the study's project
    queue: str | None = None  # the project's Kueue LocalQueue, when it names one
    processes: int = 0  # trial processes at once (packed: fewer); 0: max_concurrent
    #: the attempt's one-time start ticket (``tickets.issue``), for the driver's start only
    ticket: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_study_id(self.study_id)
        if self.processes == 0:
            object.__setattr__(self, "processes", self.max_concurrent)
        if (
            self.attempt < 1
            or self.max_concurrent < 1
            or not 1 <= self.processes <= self.max_concurrent
            or self.cpu <= 0
            or self.gpu < 0
        ):
            raise ValueError(f"invalid launch request {self}")


def check_study_id(study_id: str) -> str:
    """Study ids reach argv lists, Ray submission ids and Kubernetes names: 12 hex digits only."""
    if not isinstance(study_id, str) or not _STUDY_ID.match(study_id):
        raise BackendError(f"refusing study id {study_id!r} (expected 12 hex digits)")
    return study_id


def driver_argv(study_id: str, attempt: int) -> list[str]:
    """The driver command as an argv list (``fedtune`` on PATH, as in the image)."""
    return ["fedtune", "worker", "run-study", check_study_id(study_id), "--attempt", str(attempt)]


def python_driver_argv(study_id: str, attempt: int) -> list[str]:
    """The same command run by this interpreter (no reliance on PATH); ``main()`` reads
    ``sys.argv`` as the process's entry point (``fedtune.cli.main``)."""
    code = "import sys; from fedtune.cli import main; sys.exit(main())"
    return [sys.executable, "-c", code, *driver_argv(study_id, attempt)[1:]]


class Backend(abc.ABC):
    kind: ClassVar[BackendKind]
    #: the backend keeps an object per finished driver until ``release`` deletes it
    keeps_finished: ClassVar[bool] = False

    @abc.abstractmethod
    def launch(self, request: LaunchRequest) -> dict[str, Any]: ...

    @abc.abstractmethod
    def poll(self, ref: Mapping[str, Any]) -> DriverStatus: ...

    @abc.abstractmethod
    def stop(self, ref: Mapping[str, Any]) -> None: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients (no-op by default)."""

    def tidy(self) -> None:  # noqa: B027 - optional hook
        """Housekeeping the scheduler runs every tick, whatever the studies' states (no-op by
        default; the local backend reaps its exited drivers there)."""

    def describe(self, ref: Mapping[str, Any]) -> str | None:
        """Why the driver is in the state the last ``poll`` saw, in one line (None: no idea)."""
        return None

    def exit_info(self, ref: Mapping[str, Any]) -> DriverExit:
        """How a driver that ``poll`` saw fail ended (nothing known by default).

        Args:
            ref: the driver's reference, as ``launch`` returned it.

        Returns:
            Its exit status and last error line, each None where unknown.
        """
        return DriverExit()

    def check(self) -> None:  # noqa: B027 - optional hook
        """Raise ``BackendAuthError``/``BackendUnreachableError`` when the backend cannot be
        used at all (no-op by default: a backend with nothing to reach is always usable)."""

    def waiting(self, ref: Mapping[str, Any]) -> str | None:
        """Why a launched driver has not started yet, when a queue outside fedtune holds it
        (Kueue: the Workload's reason); None when it is not held. Read after ``poll``."""
        return None

    def release(self, ref: Mapping[str, Any]) -> bool:
        """Delete what is kept of a finished driver; True once nothing is left (default)."""
        return True

    def capacity_gpus(self) -> float | None:
        """GPUs of the cluster the drivers run on, as the cluster reports them (None: unknown;
        admission then limits only by ``FEDTUNE_CLUSTER_GPUS``, if set)."""
        return None
