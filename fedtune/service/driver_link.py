"""How a study driver reads and records its own study: through the service's API, or its database.

A driver reports to the service through a *link* with one method per thing it does
(:class:`DriverLink`):

* :class:`ApiLink` — ``FEDTUNE_DRIVER_URL`` and the credential the driver's one-time start
  ticket was exchanged for (``FEDTUNE_DRIVER_TICKET``: :mod:`.driver_start`, :mod:`.tickets`):
  the service's ``/v1/driver/studies/<id>`` routes (:mod:`.api.routes_driver`) as that study
  and that dispatch attempt only. The driver then holds no credential of the service's
  database, so nothing it runs (uploaded code included) can read or write another study, and
  its start carried no credential either. Every backend uses it when the service knows a URL
  its drivers reach (``FEDTUNE_DRIVER_URL``: ``fedtune serve`` sets its own loopback URL for the
  ``local`` backend; ``FEDTUNE_PUBLIC_URL`` for ``ray`` and ``kubernetes``);
* :class:`DbLink` — ``FEDTUNE_DATABASE_URL``: the database itself, where the service gives no
  URL (an embedding without an HTTP server, a cluster whose drivers cannot reach the API).

Both call the same functions (:mod:`.driver_ops`). The API link turns a service that does not
answer (connection refused, 502/503/504) into ``DatabaseUnavailableError``, so the driver waits
for it and resumes as it does for a database outage, and a credential the service revoked (401:
its attempt was marked compromised) into ``ConflictError``, as a superseded attempt's (409).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from fedtune.errors import ConflictError, DatabaseUnavailableError, FedtuneError

from .driver_claim import Claim
from .states import StudyState, TrialState

if TYPE_CHECKING:
    from .db import Database
    from .driver_start import DriverCredentials
    from .settings import Settings

__all__ = ["ApiLink", "DbLink", "DriverLink", "link_from_environment"]


class DriverLink(Protocol):
    """What a driver does with its study (see the module docstring)."""

    study_id: str

    def claim(self) -> Claim: ...

    def finish(self, state: StudyState, **values: Any) -> bool: ...

    def heartbeat(self, attempt: int) -> bool: ...

    def is_cancelled(self) -> bool: ...

    def reset_trials(self) -> int: ...

    def set_mlflow_ids(self, run_id: str, experiment_id: str | None) -> None: ...

    def trial_started(self, number: int, params: Mapping[str, Any], run_id: str | None) -> None: ...

    def record_rounds(self, number: int, rows: Iterable[Mapping[str, Any]]) -> None: ...

    def trial_ended(
        self, number: int, state: TrialState, value: float | None, outcome: str | None
    ) -> None: ...

    def apply_finished_trials(self, records: list[dict[str, Any]]) -> int: ...

    def recover(self, attempt: int, reason: str, *, counts: bool) -> str: ...

    def ping(self) -> None: ...

    def package(self) -> bytes | None: ...

    def close(self) -> None: ...


class DbLink:
    """The driver writes the service database itself (``FEDTUNE_DATABASE_URL``)."""

    def __init__(self, db: Database, study_id: str, max_attempts: int) -> None:
        from . import driver_ops  # SQLAlchemy's models: a driver with an ApiLink never needs them

        self.db, self.study_id, self.max_attempts = db, study_id, max_attempts
        self._ops = driver_ops

    def claim(self) -> Claim:
        return self._ops.claim(self.db, self.study_id)

    def finish(self, state: StudyState, **values: Any) -> bool:
        return self._ops.finish(self.db, self.study_id, state, values)

    def heartbeat(self, attempt: int) -> bool:
        return self._ops.heartbeat(self.db, self.study_id, attempt)

    def is_cancelled(self) -> bool:
        return self._ops.is_cancelled(self.db, self.study_id)

    def reset_trials(self) -> int:
        return self._ops.reset_trials(self.db, self.study_id)

    def set_mlflow_ids(self, run_id: str, experiment_id: str | None) -> None:
        self._ops.set_mlflow_ids(self.db, self.study_id, run_id, experiment_id)

    def trial_started(self, number: int, params: Mapping[str, Any], run_id: str | None) -> None:
        self._ops.trial_started(self.db, self.study_id, number, params, run_id)

    def record_rounds(self, number: int, rows: Iterable[Mapping[str, Any]]) -> None:
        self._ops.record_rounds(self.db, self.study_id, number, rows)

    def trial_ended(
        self, number: int, state: TrialState, value: float | None, outcome: str | None
    ) -> None:
        self._ops.trial_ended(self.db, self.study_id, number, state, value, outcome)

    def apply_finished_trials(self, records: list[dict[str, Any]]) -> int:
        return self._ops.apply_finished_trials(self.db, self.study_id, records)

    def recover(self, attempt: int, reason: str, *, counts: bool) -> str:
        return self._ops.recover(
            self.db, self.study_id, attempt, reason, self.max_attempts, counts=counts
        )

    def ping(self) -> None:
        self.db.ping()

    def package(self) -> bytes | None:
        return self._ops.study_package(self.db, self.study_id)

    def close(self) -> None:
        self.db.dispose()


def _json(value: Any) -> Any:
    """``value`` with every NaN and ±∞ as None (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


class ApiLink:
    """The driver reports through the service's ``/v1/driver`` routes with its own credential."""

    def __init__(
        self,
        url: str,
        study_id: str,
        token: str,
        *,
        client: httpx.Client | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.study_id = study_id
        self._base = f"{url.rstrip('/')}/v1/driver/studies/{study_id}"
        self._client = client or httpx.Client(timeout=timeout_s)
        self._own_client = client is None
        self._headers = {"Authorization": f"Bearer {token}"}

    def _call(self, method: str, path: str = "", body: Any = None) -> httpx.Response:
        content = None if body is None else json.dumps(_json(body)).encode()
        headers = {**self._headers, **({"Content-Type": "application/json"} if content else {})}
        try:
            answer = self._client.request(
                method, self._base + path, content=content, headers=headers
            )
        except httpx.TransportError as exc:
            raise DatabaseUnavailableError(f"the fedtune service did not answer: {exc}") from exc
        if answer.status_code in (502, 503, 504):
            raise DatabaseUnavailableError(
                f"the fedtune service is unavailable ({answer.status_code}): {answer.text[:300]}"
            )
        if answer.status_code == 409:
            raise ConflictError(f"the fedtune service refused {method} {path or '/'}: superseded")
        if answer.status_code == 401:  # the attempt was marked compromised: no longer ours
            raise ConflictError(
                f"the fedtune service refused {method} {path or '/'}: the driver's credential "
                "was revoked"
            )
        if answer.status_code >= 400:
            raise FedtuneError(
                f"the fedtune service refused {method} {path or '/'} "
                f"({answer.status_code}): {answer.text[:300]}"
            )
        return answer

    def claim(self) -> Claim:
        data = self._call("GET").json()
        return Claim(
            data["state"],
            int(data["attempts"]),
            data["spec"],
            data.get("code_sha256"),
            data.get("owner"),
        )

    def finish(self, state: StudyState, **values: Any) -> bool:
        return bool(self._call("POST", "/finish", {"state": str(state), "values": values}).json())

    def heartbeat(self, attempt: int) -> bool:
        # the attempt is the token's: the service compares it with the study's current one
        return bool(self._call("POST", "/heartbeat").json())

    def is_cancelled(self) -> bool:
        return self.claim().state == StudyState.CANCELLED

    def reset_trials(self) -> int:
        return int(self._call("POST", "/trials/reset").json())

    def set_mlflow_ids(self, run_id: str, experiment_id: str | None) -> None:
        self._call("POST", "/mlflow", {"run_id": run_id, "experiment_id": experiment_id})

    def trial_started(self, number: int, params: Mapping[str, Any], run_id: str | None) -> None:
        self._call("POST", f"/trials/{int(number)}/start", {"params": params, "run_id": run_id})

    def record_rounds(self, number: int, rows: Iterable[Mapping[str, Any]]) -> None:
        rows = list(rows)
        if rows:
            self._call("POST", f"/trials/{int(number)}/rounds", rows)

    def trial_ended(
        self, number: int, state: TrialState, value: float | None, outcome: str | None
    ) -> None:
        body = {"state": str(state), "value": value, "outcome": outcome}
        self._call("POST", f"/trials/{int(number)}/end", body)

    def apply_finished_trials(self, records: list[dict[str, Any]]) -> int:
        return int(self._call("POST", "/trials/finished", records).json()) if records else 0

    def recover(self, attempt: int, reason: str, *, counts: bool) -> str:
        return str(self._call("POST", "/recover", {"reason": reason, "counts": counts}).json())

    def ping(self) -> None:
        self._call("GET")

    def package(self) -> bytes | None:
        answer = self._call("GET", "/code")
        return answer.content if answer.status_code == 200 else None

    def close(self) -> None:
        if self._own_client:
            self._client.close()


def link_from_environment(
    study_id: str, settings: Settings, credentials: DriverCredentials | None
) -> DriverLink:
    """The link a driver's settings name (see the module docstring).

    Args:
        study_id: the driver's study.
        settings: the driver's settings (``driver.load_driver_settings`` refuses ones that
            name neither a driver URL and ticket nor a database URL).
        credentials: what its start ticket was exchanged for
            (:func:`.driver_start.driver_credentials`; None: no driver URL).

    Returns:
        An :class:`ApiLink` with the credentials, else a :class:`DbLink` on
        ``FEDTUNE_DATABASE_URL``.
    """
    if settings.driver_url and credentials is not None:
        return ApiLink(settings.driver_url, study_id, credentials.token)
    from .db import Database

    return DbLink(Database(settings.database_url), study_id, settings.max_dispatch_attempts)
