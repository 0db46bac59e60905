"""The fedtune exception tree (one module, STYLE.md habit 5).

Every error that a user can cause carries the *field* it concerns (a dotted path such as
``hparams.client_lr`` or ``task.clients``) and a *reason*, so the CLI can print one line and
exit 2 and the service can answer 422 with the path.

    FedtuneError
    ├── ConfigError        invalid configuration / spec / search space (field + reason)
    ├── DataError          a dataset file is missing or malformed (file + what was expected)
    ├── NotFoundError      an object (study, trial, algorithm, task) does not exist
    ├── ConflictError      an illegal state change (e.g. cancelling a finished study)
    └── BackendError       an execution backend failed (Ray, Kubernetes)
"""

from __future__ import annotations

__all__ = [
    "BackendError",
    "ConfigError",
    "ConflictError",
    "DataError",
    "FedtuneError",
    "NotFoundError",
]


class FedtuneError(Exception):
    """Base class of every error raised on purpose by fedtune."""

    code = "fedtune_error"


class ConfigError(FedtuneError, ValueError):
    """Invalid configuration: names the offending field (dotted path) and the reason."""

    code = "invalid_config"

    def __init__(self, field: str, reason: str, source: str | None = None) -> None:
        self.field = field
        self.reason = reason
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{field}: {reason}")

    def __reduce__(self):  # picklable across processes (Ray workers)
        return (type(self), (self.field, self.reason, self.source))


class DataError(FedtuneError, ValueError):
    """A dataset file is missing or malformed: names the file and what was expected."""

    code = "invalid_data"

    def __init__(self, path: str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class NotFoundError(FedtuneError, LookupError):
    code = "not_found"


class ConflictError(FedtuneError):
    code = "conflict"


class BackendError(FedtuneError, RuntimeError):
    code = "backend_error"
