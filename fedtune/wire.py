"""The HTTP error contract shared by the service and the SDK: one table mapping every error to
(HTTP status, stable code), the answer body, and the typed exception rebuilt from it.

The tree::

    FedtuneError                         500 internal_error
    ├── ConfigError                      422 invalid_config      (field = dotted path)
    │   └── InvalidRequestError          422 invalid_request     (malformed body / query)
    ├── DataError                        422 invalid_data
    ├── NotFoundError                    404 not_found
    │   ├── StudyNotFoundError           404 study_not_found
    │   └── TrialNotFoundError           404 trial_not_found
    ├── ConflictError                    409 conflict
    │   ├── IllegalStateChangeError      409 illegal_state_change
    │   ├── IdempotencyKeyReusedError    409 idempotency_key_reused
    │   └── SubmissionInProgressError    409 submission_in_progress (its key is being checked)
    ├── BackendError                     502 backend_error
    │   ├── TransientError               503 transient_backend_error (retried later)
    │   │   └── RayStartError            503 ray_start_failed
    │   ├── ServiceUnreachableError      503 service_unreachable (SDK: no answer after retries)
    │   ├── ServiceWarmingUpError        503 warming_up          (/readyz while loading)
    │   ├── ServiceBusyError             503 busy                (validation slots full)
    │   ├── DatabaseUnavailableError     503 database_unavailable
    │   └── WorkdirUnwritableError       503 workdir_unwritable  (/readyz: full disk, ...)
    ├── DatabaseError                    500 database_error
    ├── UnauthorizedError                401 unauthorized        (no / malformed bearer token)
    │   └── InvalidTokenError            401 invalid_token       (unknown, revoked, expired)
    ├── ForbiddenError                   403 forbidden           (readable, not changeable)
    └── PayloadTooLargeError             413 payload_too_large

Every 503 answer carries ``Retry-After`` (seconds: :data:`RETRY_AFTER_S`), and so does a 409
``submission_in_progress``.
The answer body is ``{"error": {"code", "message", "field"}}``. The SDK rebuilds the typed
exception from ``code`` with :func:`exception_from_body`. Pure Python: this module imports nothing
beyond :mod:`fedtune.errors`, so ``pip install fedtune`` gives a working ``fedtune.Client``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fedtune.errors import (
    BackendError,
    CodeError,
    CodePackageTooLargeError,
    CodeUploadDisabledError,
    ConfigError,
    ConflictError,
    DatabaseError,
    DatabaseUnavailableError,
    DataError,
    FedtuneError,
    ForbiddenError,
    IdempotencyKeyReusedError,
    IllegalStateChangeError,
    InvalidRequestError,
    InvalidTokenError,
    NotFoundError,
    PayloadTooLargeError,
    RayStartError,
    ServiceBusyError,
    ServiceUnreachableError,
    ServiceWarmingUpError,
    StudyNotFoundError,
    SubmissionInProgressError,
    TransientError,
    TrialNotFoundError,
    UnauthorizedError,
    WorkdirUnwritableError,
)

__all__ = [
    "ERROR_TABLE",
    "RETRY_AFTER_S",
    "error_body",
    "exception_from_body",
    "retry_after",
    "status_and_code",
]

#: ``Retry-After`` of a 503, by code (a full validation pool frees up in about a second; a
#: database, a disk or a Ray start takes longer); any other 503: ``RETRY_AFTER_S["*"]``; and of
#: the 409 ``submission_in_progress`` (a check that outlived its bound is taken over soon after)
RETRY_AFTER_S = {"busy": 1, "warming_up": 2, "submission_in_progress": 5, "*": 5}

#: exception class → (HTTP status, stable code), looked up along the MRO. Within one status the
#: generic class comes last: an unknown code falls back on it (see _class_for_status).
ERROR_TABLE: dict[type[BaseException], tuple[int, str]] = {
    CodePackageTooLargeError: (413, "code_too_large"),
    CodeError: (422, "invalid_code"),
    InvalidRequestError: (422, "invalid_request"),
    DataError: (422, "invalid_data"),
    ConfigError: (422, "invalid_config"),
    StudyNotFoundError: (404, "study_not_found"),
    TrialNotFoundError: (404, "trial_not_found"),
    NotFoundError: (404, "not_found"),
    IllegalStateChangeError: (409, "illegal_state_change"),
    IdempotencyKeyReusedError: (409, "idempotency_key_reused"),
    SubmissionInProgressError: (409, "submission_in_progress"),
    ConflictError: (409, "conflict"),
    ServiceUnreachableError: (503, "service_unreachable"),
    ServiceWarmingUpError: (503, "warming_up"),
    ServiceBusyError: (503, "busy"),
    DatabaseUnavailableError: (503, "database_unavailable"),
    WorkdirUnwritableError: (503, "workdir_unwritable"),
    RayStartError: (503, "ray_start_failed"),
    TransientError: (503, "transient_backend_error"),
    BackendError: (502, "backend_error"),
    DatabaseError: (500, "database_error"),
    InvalidTokenError: (401, "invalid_token"),
    UnauthorizedError: (401, "unauthorized"),
    CodeUploadDisabledError: (403, "code_upload_disabled"),
    ForbiddenError: (403, "forbidden"),
    PayloadTooLargeError: (413, "payload_too_large"),
    FedtuneError: (500, "internal_error"),
}


def retry_after(code: str) -> str:
    """Give the ``Retry-After`` header of a 503 answer.

    Args:
        code: The answer's stable error code.

    Returns:
        The delay in seconds, as the header's text.
    """
    return str(RETRY_AFTER_S.get(code, RETRY_AFTER_S["*"]))


_BY_CODE: dict[str, type[FedtuneError]] = {code: cls for cls, (_, code) in ERROR_TABLE.items()}

# One owner for each code: the table above. Classes carry it as ``code`` for convenience.
for _cls, (_status, _code) in ERROR_TABLE.items():
    _cls.code = _code  # type: ignore[attr-defined]


def status_and_code(exc: BaseException) -> tuple[int, str]:
    """Look up the HTTP status and stable code of an exception.

    Args:
        exc: Any exception; its most specific class in :data:`ERROR_TABLE` decides.

    Returns:
        ``(status, code)``; ``(500, "internal_error")`` for an exception not in the table.
    """
    for cls in type(exc).__mro__:
        if cls in ERROR_TABLE:
            return ERROR_TABLE[cls]
    return 500, "internal_error"


def error_body(exc: BaseException) -> dict[str, Any]:
    """Build the body of an error answer (never a traceback).

    Args:
        exc: The exception to answer with; one that is not a ``FedtuneError`` becomes
            ``internal server error``.

    Returns:
        ``{"error": {"code", "message", "field"}}``.
    """
    _, code = status_and_code(exc)
    if isinstance(exc, ConfigError):
        message, field = exc.reason, exc.field
    elif isinstance(exc, DataError):
        message, field = exc.reason, exc.path
    elif isinstance(exc, FedtuneError):
        message, field = str(exc), getattr(exc, "field", None)
    else:
        message, field = "internal server error", None
    return {"error": {"code": code, "message": message, "field": field}}


def exception_from_body(status: int, body: Any) -> FedtuneError:
    """Rebuild the typed exception from an error answer.

    Args:
        status: The answer's HTTP status; it picks the class when the code is unknown.
        body: The decoded answer, ``{"error": {"code", "message", "field"}}`` (anything else
            is tolerated).

    Returns:
        The exception, with ``status``, ``code`` and ``field`` attributes.
    """
    err = body.get("error") if isinstance(body, Mapping) else None
    err = err if isinstance(err, Mapping) else {}
    code = str(err.get("code") or "")
    message = str(err.get("message") or f"HTTP {status}")
    field = err.get("field")
    cls = _BY_CODE.get(code) or _class_for_status(status)
    if issubclass(cls, ConfigError):
        exc: FedtuneError = cls(str(field or ""), message)
    elif issubclass(cls, DataError):
        exc = cls(str(field or ""), message)
    else:
        exc = cls(message)
    exc.status = status  # type: ignore[attr-defined]
    exc.code = code or ERROR_TABLE[cls][1]  # type: ignore[attr-defined]
    exc.field = field  # type: ignore[attr-defined]
    return exc


def _class_for_status(status: int) -> type[FedtuneError]:
    for cls, (st, _) in reversed(ERROR_TABLE.items()):  # generic classes come last
        if st == status:
            return cls  # type: ignore[return-value]
    return FedtuneError
