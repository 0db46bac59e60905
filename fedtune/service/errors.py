"""Service errors: the tree lives in :mod:`fedtune.errors` and the HTTP contract (status, code,
body) in :mod:`fedtune.wire`, both shared with the SDK; this module re-exports them for the
server side."""

from fedtune.errors import (
    CodePackageTooLargeError,
    CodeUploadDisabledError,
    DatabaseError,
    DatabaseUnavailableError,
    ForbiddenError,
    IdempotencyKeyReusedError,
    IllegalStateChangeError,
    InvalidRequestError,
    InvalidTokenError,
    PayloadTooLargeError,
    ServiceBusyError,
    ServiceUnreachableError,
    ServiceWarmingUpError,
    StudyNotFoundError,
    TrialNotFoundError,
    UnauthorizedError,
    WorkdirUnwritableError,
)
from fedtune.wire import ERROR_TABLE, error_body, exception_from_body, retry_after, status_and_code

__all__ = [
    "ERROR_TABLE",
    "CodePackageTooLargeError",
    "CodeUploadDisabledError",
    "DatabaseError",
    "DatabaseUnavailableError",
    "ForbiddenError",
    "IdempotencyKeyReusedError",
    "IllegalStateChangeError",
    "InvalidRequestError",
    "InvalidTokenError",
    "PayloadTooLargeError",
    "ServiceBusyError",
    "ServiceUnreachableError",
    "ServiceWarmingUpError",
    "StudyNotFoundError",
    "TrialNotFoundError",
    "UnauthorizedError",
    "WorkdirUnwritableError",
    "error_body",
    "exception_from_body",
    "retry_after",
    "status_and_code",
]
