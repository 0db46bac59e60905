"""How a study driver gets its credentials: it redeems its start ticket, once.

A driver that reports to the service's API starts with ``FEDTUNE_DRIVER_URL`` and a one-time
ticket, ``FEDTUNE_DRIVER_TICKET`` (:mod:`.tickets`), never a credential: whatever started it
(a Ray job's ``runtime_env``, a RayJob, a process's environment) may be read by others. It
exchanges the ticket for its credentials (:func:`redeem_ticket`): its study's driver credential
and, with MLflow workspaces, its project's MLflow login. They stay in this process's memory
(:class:`DriverCredentials`):

* the credential in the driver's link (:class:`.driver_link.ApiLink`);
* the MLflow login in the tracking URI the driver hands to its study
  (:func:`tracking_uri_with_login`: ``http://user:password@host``, which the study keeps in its
  plan only and strips from everything it writes; MLflow's client sends it as basic auth), never
  in ``MLFLOW_TRACKING_PASSWORD``: a variable set now would reach every process the driver
  starts. The trials never log to MLflow (the driver does), so they need no login at all;
* a driver that re-runs itself in a sandbox on a shared Ray head (:mod:`.head_sandbox`) writes
  them to the sandboxed driver's standard input (:func:`write_credentials`), which reads them
  there (:func:`read_credentials`, ``FEDTUNE_DRIVER_CREDENTIALS_ON_STDIN``).

A redemption is never retried: a second one, even of a request whose answer was lost, would
mark the attempt compromised. A refused ticket (404 unknown, 401 expired, 409 already redeemed)
raises ``ConflictError``; the driver then exits 77 and the service re-dispatches the study.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING
from urllib.parse import quote, urlsplit, urlunsplit

import httpx

from fedtune.errors import ConflictError, DatabaseUnavailableError, FedtuneError

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "DriverCredentials",
    "MlflowLogin",
    "driver_credentials",
    "read_credentials",
    "redeem_ticket",
    "tracking_uri_with_login",
    "write_credentials",
]


@dataclass(frozen=True)
class MlflowLogin:
    """A project's MLflow driver login (``mlflow_workspaces.driver_user``)."""

    username: str
    password: str

    def __repr__(self) -> str:  # never the password
        return f"MlflowLogin(username={self.username!r})"


@dataclass(frozen=True)
class DriverCredentials:
    """What a redeemed ticket gives a driver, held in its memory only."""

    attempt: int
    token: str
    mlflow: MlflowLogin | None = None

    def __repr__(self) -> str:  # never the credential
        return f"DriverCredentials(attempt={self.attempt}, mlflow={self.mlflow!r})"

    def as_json(self) -> dict:
        """The credentials as the redemption route answers them."""
        login = self.mlflow
        mlflow = None if login is None else {"username": login.username, "password": login.password}
        return {"attempt": self.attempt, "token": self.token, "mlflow": mlflow}

    @classmethod
    def from_json(cls, data: dict) -> DriverCredentials:
        """The credentials from :meth:`as_json`'s form."""
        login = data.get("mlflow")
        mlflow = MlflowLogin(str(login["username"]), str(login["password"])) if login else None
        return cls(int(data["attempt"]), str(data["token"]), mlflow)


def redeem_ticket(
    url: str,
    study_id: str,
    ticket: str,
    *,
    client: httpx.Client | None = None,
    timeout_s: float = 60.0,
) -> DriverCredentials:
    """Exchange the driver's start ticket for its credentials, once.

    Args:
        url: the service's URL (``FEDTUNE_DRIVER_URL``).
        study_id: the driver's study.
        ticket: its start ticket.
        client: the HTTP client to use (default: a new one).
        timeout_s: the request's timeout.

    Returns:
        The credentials.

    Raises:
        ConflictError: the service refused the ticket (unknown, expired or already redeemed).
        DatabaseUnavailableError: the service did not answer (not retried: see the module
            docstring).
    """
    target = f"{url.rstrip('/')}/v1/driver/studies/{study_id}/ticket"
    headers = {"Authorization": f"Bearer {ticket}"}
    try:
        if client is None:
            with httpx.Client(timeout=timeout_s) as own:
                answer = own.post(target, headers=headers)
        else:
            answer = client.post(target, headers=headers)
    except httpx.TransportError as exc:
        raise DatabaseUnavailableError(f"the fedtune service did not answer: {exc}") from exc
    if answer.status_code in (401, 404, 409):
        raise ConflictError(
            f"the fedtune service refused the driver's start ticket ({answer.status_code}): "
            f"{_message(answer)}"
        )
    if answer.status_code >= 400:
        raise FedtuneError(
            f"redeeming the driver's start ticket failed ({answer.status_code}): {_message(answer)}"
        )
    return DriverCredentials.from_json(answer.json())


def _message(answer: httpx.Response) -> str:
    try:
        return str(answer.json()["error"]["message"])[:300]
    except (ValueError, KeyError, TypeError):
        return answer.text[:300]


def write_credentials(credentials: DriverCredentials, stream: IO[bytes]) -> None:
    """Hand the credentials to a driver started with ``FEDTUNE_DRIVER_CREDENTIALS_ON_STDIN``.

    Args:
        credentials: this driver's credentials.
        stream: the other driver's standard input (closed here).
    """
    with stream:
        stream.write(json.dumps(credentials.as_json()).encode())


def read_credentials(stream: IO[bytes]) -> DriverCredentials:
    """The credentials another driver wrote to this one's standard input.

    Args:
        stream: standard input (read to its end).

    Returns:
        The credentials.
    """
    return DriverCredentials.from_json(json.loads(stream.read()))


def driver_credentials(study_id: str, settings: Settings) -> DriverCredentials | None:
    """This driver's credentials, as its settings say to get them (see the module docstring).

    Args:
        study_id: the driver's study.
        settings: its settings.

    Returns:
        The credentials; None for a driver that writes the database itself (no driver URL).
    """
    if settings.driver_credentials_on_stdin:
        import sys

        return read_credentials(sys.stdin.buffer)
    if settings.driver_url and settings.driver_ticket is not None:
        return redeem_ticket(
            settings.driver_url, study_id, settings.driver_ticket.get_secret_value()
        )
    return None


def tracking_uri_with_login(uri: str, login: MlflowLogin | None) -> str:
    """``uri`` with the MLflow login as its user and password, for an http(s) tracking server.

    Args:
        uri: the tracking URI (without credentials).
        login: the project's MLflow login (None: ``uri`` unchanged).

    Returns:
        ``http(s)://<user>:<password>@host…``; any other URI unchanged.
    """
    parts = urlsplit(uri)
    if login is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return uri
    host = parts.netloc.rsplit("@", 1)[-1]
    userinfo = f"{quote(login.username, safe='')}:{quote(login.password, safe='')}"
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{host}"))
