"""Which driver errors are worth another dispatch.

A study driver that fails does so for one of two kinds of reasons:

* **transient** — the same work may succeed a little later: Ray did not start (a loaded
  machine, a cluster restarting: :class:`~fedtune.errors.RayStartError` and every other
  :class:`~fedtune.errors.TransientError`), a connection refused, reset or timed out (builtin
  ``ConnectionError``/``TimeoutError``, ``requests``' connection errors: an MLflow server
  restarting). The driver puts the study back in the queue after
  ``FEDTUNE_RETRY_BACKOFF_S · 2^(attempt−1)`` seconds while ``attempt <
  FEDTUNE_MAX_DISPATCH_ATTEMPTS`` (the scheduler re-dispatches it: attempt + 1; it resumes from
  its Optuna storage), and fails it after the last attempt;
* **permanent** — anything else: an invalid spec, resources the cluster lacks, user code that
  raises. Trying again gives the same answer, so the study fails at once.

An error is transient when it, or an error it was raised from (``__cause__``/``__context__``),
is of a transient kind — unless the error itself is a fedtune error that is not transient (a
``ConfigError`` says what to fix, whatever it was raised from).

A driver that dies before it can record anything (a command not found, a configuration it
refuses) is classified by its **exit status** instead, here and nowhere else
(:func:`permanent_exit`): 2 (misconfigured: ``fedtune`` reports a ``ConfigError`` or a bad
argument with exit status 2), 126 (the command cannot be executed) and 127 (command not found)
are permanent — the study fails with its first attempt; any other status (a crash, a signal, a
lost node) may pass, and the study is dispatched again while attempts are left.

A **database outage** (:func:`is_database_outage`: the service database unreachable, a
``DatabaseUnavailableError`` or SQLAlchemy's connection errors anywhere in the chain) is the
service's fault, not the study's: the driver waits for the database and re-queues the study
without using up one of its attempts (three outages used to fail a study).
"""

from __future__ import annotations

from fedtune.errors import FedtuneError, TransientError

__all__ = [
    "PERMANENT_EXITS",
    "is_database_outage",
    "is_transient",
    "permanent_exit",
    "retry_delay_s",
]

#: exit statuses of a driver that another dispatch would end the same way, and what they mean
PERMANENT_EXITS = {
    2: "a configuration error",
    126: "the command cannot be executed",
    127: "command not found",
}

#: ``module.Class`` names of SQLAlchemy errors that mean "the database did not answer"
_OUTAGE_NAMES = frozenset(
    {
        "sqlalchemy.exc.OperationalError",
        "sqlalchemy.exc.InterfaceError",
        "sqlalchemy.exc.TimeoutError",
    }
)

#: ``module.Class`` names of third-party errors that mean "could not reach it (yet)"
_TRANSIENT_NAMES = frozenset(
    {
        "requests.exceptions.ConnectionError",
        "requests.exceptions.Timeout",
        "urllib3.exceptions.NewConnectionError",
        "urllib3.exceptions.MaxRetryError",
    }
)
_MAX_CHAIN = 20


def _transient_kind(exc: BaseException) -> bool:
    if isinstance(exc, (TransientError, ConnectionError, TimeoutError)):
        return True
    return any(f"{c.__module__}.{c.__qualname__}" in _TRANSIENT_NAMES for c in type(exc).__mro__)


def is_transient(exc: BaseException) -> bool:
    """True when another dispatch of the same study may succeed (see the module docstring)."""
    if isinstance(exc, FedtuneError) and not isinstance(exc, TransientError):
        return False
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen and len(seen) < _MAX_CHAIN:
        if _transient_kind(node):
            return True
        seen.add(id(node))
        node = node.__cause__ or node.__context__
    return False


def is_database_outage(exc: BaseException) -> bool:
    """True when ``exc`` or an error it was raised from is the service database not answering."""
    from fedtune.errors import DatabaseUnavailableError

    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen and len(seen) < _MAX_CHAIN:
        if isinstance(node, DatabaseUnavailableError) or any(
            f"{c.__module__}.{c.__qualname__}" in _OUTAGE_NAMES for c in type(node).__mro__
        ):
            return True
        seen.add(id(node))
        node = node.__cause__ or node.__context__
    return False


def retry_delay_s(backoff_s: float, attempt: int) -> float:
    """Seconds before a study whose attempt ``attempt`` (1-based) failed goes back in the queue."""
    return backoff_s * 2 ** max(0, attempt - 1)


def permanent_exit(code: int | None) -> str | None:
    """Whether a driver's exit status rules out another dispatch (see the module docstring).

    Args:
        code: the driver's exit status; None when the backend does not know it.

    Returns:
        What the status means (e.g. "command not found") when it is permanent, else None.
    """
    return PERMANENT_EXITS.get(code) if code is not None else None
