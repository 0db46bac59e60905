"""The fedtune exception tree (one module, docs/development/style.md habit 5).

Every error that a user can cause carries the *field* it concerns (a dotted path such as
``hparams.client_lr`` or ``task.clients``) and a *reason*, so the CLI can print one line and
exit 2 and the service can answer 422 with the path.

    FedtuneError
    ├── ConfigError        invalid configuration / spec / search space (field + reason)
    │   └── CodeError      user code (a study's ``code:``, an entry point) failed to import or
    │                      register: field + reason + ``location`` (file:line of the error)
    ├── DataError          a dataset file is missing or malformed (file + what was expected)
    ├── NotFoundError      an object (study, trial, algorithm, task) does not exist
    ├── ConflictError      an illegal state change (e.g. cancelling a finished study)
    └── BackendError       an execution backend failed (Ray, Kubernetes)
        └── TransientError a fault that may pass (a cluster starting, a connection lost):
            │              the service re-dispatches the study with backoff
            └── RayStartError  Ray did not start after the retries of ``start_ray``

The service's errors (study not found, unauthorized, payload too large …) extend the same tree
here, so that the SDK rebuilds them from an HTTP answer without importing any server module;
their HTTP status and stable code are in :mod:`fedtune.wire`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "BackendError",
    "CodeError",
    "CodePackageTooLargeError",
    "CodeUploadDisabledError",
    "ConfigError",
    "ConflictError",
    "DataError",
    "DatabaseError",
    "DatabaseUnavailableError",
    "FedtuneError",
    "ForbiddenError",
    "IdempotencyKeyReusedError",
    "IllegalStateChangeError",
    "InvalidRequestError",
    "InvalidTokenError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RayStartError",
    "ServiceBusyError",
    "ServiceUnreachableError",
    "ServiceWarmingUpError",
    "StudyNotFoundError",
    "SubmissionInProgressError",
    "TransientError",
    "TrialNotFoundError",
    "UnauthorizedError",
    "WorkdirUnwritableError",
    "as_mapping",
    "combine_errors",
]


class FedtuneError(Exception):
    """Base class of every error raised on purpose by fedtune."""

    code = "fedtune_error"


class ConfigError(FedtuneError, ValueError):
    """Invalid configuration: names the offending field and the reason.

    Args:
        field: The dotted path of the field, e.g. ``hparams.client_lr``.
        reason: What is wrong with it, in one line.
        source: The file the configuration came from, if any.
    """

    code = "invalid_config"

    def __init__(self, field: str, reason: str, source: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {reason}")

    def __reduce__(self):  # picklable across processes (Ray workers)
        return (type(self), (self.field, self.reason, self.source))

    def with_source(self, source: str | None) -> ConfigError:
        """Copy this error (same type and extras), attributed to another file.

        Args:
            source: The file the configuration came from (None: none).

        Returns:
            The new error.
        """
        fn, args = self.__reduce__()[:2]
        new = fn(*args)
        new.source = source
        where = f"{source}: " if source else ""
        new.args = (f"{where}{new.field}: {new.reason}",)
        return new


def combine_errors(errors: list[ConfigError], field: str | None = None) -> ConfigError:
    """Combine several errors into one, on one line.

    Args:
        errors: The errors; combined ones are flattened.
        field: The field of the result (default: the fields' common prefix).

    Returns:
        The only error, or ``<field>: N conflicts: a: …; b: …`` with the parts in ``.parts``.
    """
    flat = [part for e in errors for part in getattr(e, "parts", [e])]
    if len(flat) == 1:
        return flat[0]
    common = [f.split(".") for f in (e.field for e in flat)]
    prefix = []
    for parts in zip(*common, strict=False):
        if len(set(parts)) != 1:
            break
        prefix.append(parts[0])
    parts = "; ".join(f"{e.field}: {e.reason}" for e in flat)
    sources = {e.source for e in flat}
    source = sources.pop() if len(sources) == 1 else None
    out = ConfigError(
        field or ".".join(prefix) or "<spec>", f"{len(flat)} conflicts: {parts}", source
    )
    out.parts = flat
    return out


def as_mapping(
    value: object,
    field: str,
    source: str | None = None,
    *,
    what: str = "",
    error: type[ConfigError] = ConfigError,
) -> Mapping[str, Any]:
    """Give a raw document's section as a mapping, or say that it is not one.

    This is the one check of a document's shape before its typed model reads it (a model's
    own errors go through :func:`fedtune.trainers.typed.config_error`).

    Args:
        value: The section as read (YAML, JSON).
        field: Its dotted path, as the error names it.
        source: The file it came from, if any.
        what: Words after "must be a mapping" (what its keys are).
        error: The error type (``InvalidRequestError`` for a request's body).

    Returns:
        ``value``, unchanged.

    Raises:
        ConfigError: ``value`` is not a mapping (of type ``error``).
    """
    if isinstance(value, Mapping):
        return value
    raise error(field, f"must be a mapping{what}, got {type(value).__name__}", source)


class CodeError(ConfigError):
    """User code failed at import or registration time.

    E.g. a syntax or import error, a registration without bounds, a missing registration.

    Args:
        field: The spec field that named the code (``code.modules[0]``, ``task.name``).
        reason: What went wrong, in one line.
        location: ``file:line`` of the error, if known.
        source: The spec file, if any.
    """

    def __init__(
        self, field: str, reason: str, location: str | None = None, source: str | None = None
    ) -> None:
        self.location = location
        full = f"{reason} (at {location})" if location else reason
        super().__init__(field, full, source)
        self.bare_reason = reason

    def __reduce__(self):
        return (type(self), (self.field, self.bare_reason, self.location, self.source))


class DataError(FedtuneError, ValueError):
    """A dataset file is missing or malformed.

    Args:
        path: The file.
        reason: What was expected of it.
    """

    code = "invalid_data"

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class NotFoundError(FedtuneError, LookupError):
    """An object (study, trial, algorithm, task) does not exist."""

    code = "not_found"


class ConflictError(FedtuneError):
    """The request conflicts with what exists (a name taken, a state, another driver)."""

    code = "conflict"


class BackendError(FedtuneError, RuntimeError):
    """An execution backend (Ray, Kubernetes) or a store failed."""

    code = "backend_error"


class TransientError(BackendError):
    """A fault that may pass if the same work is tried again later (Ray starting, a lost link).

    The service re-dispatches such a study with backoff, up to
    ``FEDTUNE_MAX_DISPATCH_ATTEMPTS`` times; a permanent error fails it at once.
    """


class RayStartError(TransientError):
    """Ray did not start (or could not be reached) after every attempt; one-line message."""


# --- errors of the service and its SDK (HTTP status and code: fedtune.wire.ERROR_TABLE)


class InvalidRequestError(ConfigError):
    """The request itself is malformed (JSON body, query parameter): names the field."""


class StudyNotFoundError(NotFoundError):
    """No study has this id, or the caller may not see it."""


class TrialNotFoundError(NotFoundError):
    """The study has no trial with this number."""


class IllegalStateChangeError(ConflictError):
    """E.g. cancelling a study that already succeeded."""


class IdempotencyKeyReusedError(ConflictError):
    """An ``Idempotency-Key`` sent again with a different body."""


class SubmissionInProgressError(ConflictError):
    """A submission whose ``Idempotency-Key`` another request is still checking, after waiting
    for that check as long as it may take; retry after the answer's ``Retry-After`` (the SDK
    does)."""


class DatabaseUnavailableError(BackendError):
    """The database cannot be reached (connection refused, timeout, locked too long)."""


class WorkdirUnwritableError(BackendError):
    """The service's work directory cannot be written (full disk, read-only mount).

    The service can take no study; ``/readyz`` says so, naming the directory and the reason.
    """


class ServiceWarmingUpError(BackendError):
    """The service has started but is still loading the tuning stack (``/readyz`` only)."""


class ServiceBusyError(BackendError):
    """Every submission-validation slot is taken (``FEDTUNE_MAX_CONCURRENT_VALIDATIONS``).

    Retry after the answer's ``Retry-After`` seconds; the SDK does.
    """


class ServiceUnreachableError(BackendError):
    """Raised by the SDK: the service did not answer (connection errors, 5xx) after retries."""


class DatabaseError(FedtuneError):
    """Any other database failure (the transaction was rolled back)."""


class UnauthorizedError(FedtuneError):
    """No bearer token, or a malformed ``Authorization`` header, while one is required."""


class InvalidTokenError(UnauthorizedError):
    """A bearer token that authenticates nobody: unknown, revoked, expired, a bad JWT."""


class ForbiddenError(FedtuneError):
    """The caller may see the resource but not do this to it (a project's viewer cancelling)."""


class PayloadTooLargeError(FedtuneError):
    """The request's body is larger than the service accepts."""


class CodeUploadDisabledError(ForbiddenError):
    """A study with user code while the operator has not enabled uploads.

    Uploads are enabled by ``FEDTUNE_ALLOW_CODE_UPLOAD``.
    """

    field = "code"


class CodePackageTooLargeError(ConfigError):
    """A code package (or what it unpacks to) exceeds ``FEDTUNE_MAX_CODE_BYTES`` (413)."""
