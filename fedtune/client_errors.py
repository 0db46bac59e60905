"""What the SDK says when a call goes wrong: one line that names the URL or the setting, never a
credential (the settings themselves are checked when the client is made:
:func:`fedtune.client_settings.check_url`, :func:`~fedtune.client_settings.check_token`).

* :func:`transport_failure` and :func:`answer_failure` sort a failed attempt into what a retry may
  cure (a refused connection, a timeout, a 5xx, a 429) and a configuration error, which is raised
  at once: TLS spoken to a plain-HTTP server or the reverse, an HTML page (the MLflow UI), an
  answer that is not fedtune's, a 404 of a route every fedtune service has.
* :func:`masked` passes every exception the client raises through :func:`fedtune.redact.mask`
  (the client's token, any ``Bearer``/``Authorization``/``password`` text) and cuts its chain, so
  that no traceback shows an ``httpx`` error quoting the ``Authorization`` header.

Pure Python and ``httpx``: the light install (``pip install fedtune``) imports it.
"""

from __future__ import annotations

import errno
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from fedtune.client_settings import SettingNames, shown
from fedtune.errors import ConfigError, FedtuneError, ServiceUnreachableError, UnauthorizedError
from fedtune.redact import mask

__all__ = [
    "Failure",
    "answer_failure",
    "fedtune_body",
    "masked",
    "transport_failure",
    "unauthorized",
    "unreachable",
]

#: how long the probe of an ``http://`` URL for a TLS server waits (only after a failed attempt)
PROBE_TIMEOUT_S = 3.0
#: what nginx answers a plain-HTTP request on its TLS port with
_NGINX_TLS_PORT = "plain HTTP request was sent to HTTPS port"
#: the routes every fedtune service has (a 404 of one: the URL is not a fedtune service's root)
_SERVICE_ROUTES = ("/v1/whoami", "/v1/studies", "/v1/algorithms", "/v1/tasks", "/v1/search-spaces")


@dataclass(frozen=True)
class Failure:
    """A failed attempt: why, in a few words, and the error to raise at once (None: retry).

    Args:
        reason: e.g. ``connection refused``.
        fatal: a configuration error that no retry cures.
    """

    reason: str
    fatal: FedtuneError | None = None


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    node: BaseException | None = exc
    while node is not None and id(node) not in seen:
        seen.add(id(node))
        yield node
        node = node.__cause__ or node.__context__


def _tls_answer(base: str) -> str:
    parts = urlsplit(base)
    return urlunsplit(("https", parts.netloc, parts.path, "", ""))


def _speaks_tls(base: str) -> bool:
    """Whether the server of an ``http://`` URL completes a TLS handshake (certificate not
    checked: this only tells which protocol it speaks)."""
    parts = urlsplit(base)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection((parts.hostname, parts.port or 80), PROBE_TIMEOUT_S) as raw,
            context.wrap_socket(raw, server_hostname=parts.hostname),
        ):
            return True
    except (OSError, ValueError):
        return False


def transport_failure(
    exc: BaseException,
    base: str,
    names: SettingNames,
    timeout: float | None = None,
    *,
    probe: bool = True,
) -> Failure:
    """Sort an attempt that got no answer.

    Args:
        exc: what ``httpx`` raised (or a ``UnicodeError`` of a header).
        base: the service's base URL.
        names: what the settings are called.
        timeout: the attempt's answer timeout, for the message.
        probe: after a connection closed without an answer to an ``http://`` URL, try a TLS
            handshake to tell a TLS server (False: the transport is no network).

    Returns:
        The failure; ``fatal`` for TLS against plain HTTP (and the reverse), a certificate
        this machine does not trust, and any error of the request itself.
    """
    url, https = shown(base), base.lower().startswith("https://")
    causes = list(_chain(exc))
    tls = next((c for c in causes if isinstance(c, ssl.SSLError)), None)
    if tls is not None and https:
        if isinstance(tls, ssl.SSLCertVerificationError):
            why = getattr(tls, "verify_message", None) or "certificate verify failed"
            return Failure(
                "TLS certificate refused",
                ConfigError(
                    names.url,
                    f"{url} presented a certificate this machine does not trust ({why}); "
                    "give its CA with SSL_CERT_FILE",
                ),
            )
        plain = urlunsplit(("http", *urlsplit(base)[1:3], "", ""))
        return Failure(
            "no TLS",
            ConfigError(
                names.url,
                f"{url} does not speak TLS ({tls.reason or tls}): the service speaks plain "
                f"HTTP? try {shown(plain)}",
            ),
        )
    if isinstance(exc, httpx.TimeoutException):
        if isinstance(exc, httpx.ConnectTimeout):
            return Failure("connecting timed out (a firewall, or the wrong address?)")
        return Failure(f"no answer within {timeout:g} s" if timeout else "no answer in time")
    if isinstance(exc, httpx.ConnectError):
        return Failure(_connect_reason(causes, base))
    if isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError | httpx.WriteError):
        if probe and not https and _speaks_tls(base):
            return Failure(
                "TLS",
                ConfigError(
                    names.url,
                    f"{url} speaks TLS, not plain HTTP: try {shown(_tls_answer(base))}",
                ),
            )
        return Failure("the connection closed without an answer")
    if isinstance(exc, httpx.NetworkError):
        return Failure("the network failed")
    # the request itself is wrong (a header, a URL): no retry, and never its text unmasked
    return Failure(
        "invalid request",
        ConfigError(names.url, f"cannot send a request to {url}: {type(exc).__name__}: {exc}"),
    )


def _connect_reason(causes: list[BaseException], base: str) -> str:
    for cause in causes:
        if isinstance(cause, socket.gaierror):
            return f"the name {urlsplit(base).hostname} is not known (a typo, or another network?)"
        if isinstance(cause, ConnectionRefusedError) or (
            isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED
        ):
            return "connection refused"
        if isinstance(cause, OSError) and cause.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
            return "no route to the host"
    return f"cannot connect ({causes[0]})"


def unreachable(base: str, attempts: int, reason: str, names: SettingNames) -> FedtuneError:
    """The error of a service that never answered.

    Args:
        base: the service's base URL.
        attempts: how many attempts were made.
        reason: the last attempt's reason (:attr:`Failure.reason`).
        names: what the settings are called.

    Returns:
        ``ServiceUnreachableError``: ``no answer from http://box:8000 after 5 attempts:
        connection refused — is `fedtune serve` running there? (FEDTUNE_URL)``.
    """
    return ServiceUnreachableError(
        f"no answer from {shown(base)} after {attempts} attempt{'s' * (attempts != 1)}: "
        f"{reason} — is `fedtune serve` running there? ({names.url})"
    )


# ---------------------------------------------------------------------- an answer


def fedtune_body(body: Any) -> bool:
    """Whether a decoded answer is a fedtune error answer (``{"error": {"code", ...}}``)."""
    err = body.get("error") if isinstance(body, Mapping) else None
    return isinstance(err, Mapping) and "code" in err


def answer_failure(
    answer: httpx.Response, base: str, names: SettingNames, body: Any
) -> Failure | None:
    """Sort an answer that no fedtune service gives, or that points at the configuration.

    Args:
        answer: the answer.
        base: the service's base URL.
        names: what the settings are called.
        body: the decoded answer (JSON, or None when it is not).

    Returns:
        None for an answer of a fedtune service; a retryable failure for a 5xx or 429 of
        something in front of it (a proxy); else ``fatal``: an HTML page (the MLflow UI?), a
        route every fedtune service has not found, an answer that is not fedtune's.
    """
    url, status = shown(base), answer.status_code
    what = f"{answer.request.method} {answer.request.url.path}"
    kind = answer.headers.get("content-type", "").split(";")[0].strip().lower()
    start = answer.text[:200].lstrip().lower()
    html = kind in ("text/html", "application/xhtml+xml") or start.startswith(
        ("<!doctype", "<html")
    )
    if html and _NGINX_TLS_PORT in answer.text:
        return Failure(
            "TLS",
            ConfigError(names.url, f"{url} speaks TLS: try {shown(_tls_answer(base))}"),
        )
    if status >= 500 or status == 429:
        if fedtune_body(body):
            return None
        return Failure(f"HTTP {status} from something in front of the service (a proxy?)")
    if html:
        return Failure(
            "HTML",
            ConfigError(
                names.url,
                f"this is not a fedtune service: {url} answered {what} with an HTML page — is "
                f"{names.url} the MLflow URL?",
            ),
        )
    if not answer.is_error:
        return None
    path = answer.request.url.path
    route_missing = status == 404 and path.removeprefix(urlsplit(base).path) in _SERVICE_ROUTES
    if route_missing and (not fedtune_body(body) or body["error"].get("message") == "Not Found"):
        return Failure(
            "not found",
            ConfigError(
                names.url,
                f"{url}{path.removeprefix(urlsplit(base).path)} not found: {names.url} should be "
                "the service's root, without /v1",
            ),
        )
    if not fedtune_body(body):
        return Failure(
            "not fedtune",
            ConfigError(
                names.url,
                f"this is not a fedtune service: {url} answered {what} with HTTP {status} "
                f"({kind or 'no content type'}) — is {names.url} the service's URL?",
            ),
        )
    return None


def unauthorized(exc: FedtuneError, base: str, names: SettingNames, sent: bool) -> FedtuneError:
    """A 401 that says which setting to fix (the service's words first).

    Args:
        exc: the typed 401 (``UnauthorizedError``).
        base: the service's base URL.
        names: what the settings are called.
        sent: whether a token was sent.

    Returns:
        ``exc`` with a message ending in ``(FEDTUNE_TOKEN, for http://box:8000)``.
    """
    if isinstance(exc, UnauthorizedError):
        hint = "check" if sent else "set"
        exc.args = (f"{exc} — {hint} {names.token} (for {shown(base)})",)
    return exc


def masked(exc: FedtuneError, secrets: Iterable[str | None]) -> FedtuneError:
    """``exc`` with its message (and fields) through :func:`fedtune.redact.mask`, and no chain.

    Args:
        exc: the error about to be raised.
        secrets: the values to mask (the client's token, passwords it received).

    Returns:
        ``exc``, changed in place: its ``args`` and text attributes masked, ``__cause__`` and
        ``__context__`` cleared (an ``httpx`` error may quote the ``Authorization`` header).
    """
    secrets = list(secrets)
    exc.args = tuple(mask(a, secrets) if isinstance(a, str) else a for a in exc.args)
    for name in ("reason", "field", "bare_reason", "location"):
        value = getattr(exc, name, None)
        if isinstance(value, str):
            setattr(exc, name, mask(value, secrets))
    exc.__cause__ = exc.__context__ = None
    exc.__suppress_context__ = True
    return exc
