"""The SDK's HTTP layer: one service, its token, the retries, and errors that help and never leak.

:class:`ServiceHttp` makes every request of a :class:`fedtune.client.Client`. Connection errors,
timeouts, 5xx and 429 answers (and a submission another request is still checking) are retried
with exponential backoff, ``backoff_s · 2^k``, or the answer's ``Retry-After`` when longer (at
most :data:`MAX_RETRY_AFTER_S`); what no retry cures is raised at once, in one line naming the
setting to change (:mod:`fedtune.client_errors`). Every error passes :func:`fedtune.redact.mask`
with the token and the passwords the service handed this client, and chains no ``httpx`` error
(one may quote the ``Authorization`` header).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from fedtune.client_errors import (
    Failure,
    answer_failure,
    fedtune_body,
    masked,
    transport_failure,
    unauthorized,
    unreachable,
)
from fedtune.client_settings import SettingNames, check_token, check_url, shown
from fedtune.errors import FedtuneError
from fedtune.wire import exception_from_body

__all__ = ["MAX_RETRY_AFTER_S", "ServiceHttp"]

#: the longest ``Retry-After`` the SDK waits between two attempts
MAX_RETRY_AFTER_S = 30.0
#: the error codes of answers that a retry may cure besides 5xx and 429: a submission whose
#: Idempotency-Key another request is still checking
_RETRIED_CODES = frozenset({"submission_in_progress"})


class ServiceHttp:
    """The requests of one client of one service.

    Args:
        url: The service's base URL (its root: ``/v1`` is in each path).
        token: A bearer token (None: send none).
        transport: The ``httpx`` transport (None: the network).
        timeout: Seconds to wait for each answer.
        retries: How many times a failure a retry may cure is retried.
        backoff_s: The first retry's delay; it doubles with each retry.
        sleep: The function that waits between retries.
        names: What messages call the URL and the token.

    Raises:
        ConfigError: ``url`` or ``token`` cannot work (:func:`~fedtune.client_settings.check_url`,
            :func:`~fedtune.client_settings.check_token`).
    """

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
        names: SettingNames | None = None,
    ) -> None:
        self.names = names or SettingNames()
        self.url = check_url(url, self.names.url)
        if token:
            check_token(token, self.names.token)
        #: what no error may show: the token, and passwords the service handed this client
        self._secrets: list[str] = [token] if token else []
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers["User-Agent"] = "fedtune-sdk"
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )
        self.timeout, self.retries, self.backoff_s, self._sleep = timeout, retries, backoff_s, sleep
        self._network = transport is None  # probes (TLS on an http:// URL) only on a network

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def keep_secret(self, secret: str) -> None:
        """Mask ``secret`` in every later error too (a password the service handed over).

        Args:
            secret: The value.
        """
        if secret:
            self._secrets.append(secret)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Make one API call, retrying connection errors, timeouts, 5xx and 429 answers.

        Args:
            method: The HTTP method.
            path: The route, e.g. ``/v1/studies``.
            **kwargs: Passed on to ``httpx.Client.request`` (``json``, ``params``, ``headers``,
                ``timeout`` …).

        Returns:
            The decoded JSON answer.

        Raises:
            FedtuneError: The service's error answer, as its typed subclass (after the retries
                for a 5xx answer).
            ConfigError: The URL or the token is wrong in a way no retry cures (field: the
                setting).
            ServiceUnreachableError: Nothing answered after the retries (the message names the
                URL).
        """
        failure: FedtuneError | None = None
        try:
            return self._attempts(method, path, kwargs)
        except FedtuneError as exc:
            failure = exc
        raise masked(failure, self._secrets)  # outside the except: nothing chained

    def _attempts(self, method: str, path: str, kwargs: dict[str, Any]) -> Any:
        """Every attempt of one call (the retry loop); raises the error to show, unmasked."""
        failed: Failure | None = None
        last: FedtuneError | None = None
        delay = 0.0
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(max(self.backoff_s * 2 ** (attempt - 1), delay))
            answer, failed = self._send(method, path, kwargs)
            last, delay = None, 0.0
            if answer is not None:
                body = _json(answer)
                failed = answer_failure(answer, self.url, self.names, body)
                if failed is None and not _retried(answer, body):
                    if answer.is_error:
                        error = exception_from_body(answer.status_code, body)
                        raise unauthorized(error, self.url, self.names, bool(self._secrets))
                    return _decode(answer) if body is None else body
                if failed is None:
                    last = exception_from_body(answer.status_code, body)
                delay = min(_retry_after(answer), MAX_RETRY_AFTER_S)
            if failed is not None and failed.fatal is not None:
                raise failed.fatal
        if last is not None:  # the service answered, with an error, every time
            tries = f"{self.retries + 1} attempt{'s' * bool(self.retries)}"
            last.args = (f"{last} ({shown(self.url)}, HTTP {last.status} to {tries})",)
            raise last
        reason = failed.reason if failed is not None else "no answer"
        raise unreachable(self.url, self.retries + 1, reason, self.names)

    def _send(
        self, method: str, path: str, kwargs: dict[str, Any]
    ) -> tuple[httpx.Response, None] | tuple[None, Failure]:
        """One attempt: the answer, or why there is none (never an ``httpx`` exception)."""
        try:
            return self._http.request(method, path, **kwargs), None
        except (httpx.HTTPError, UnicodeError) as exc:
            timeout = kwargs.get("timeout", self.timeout)
            timeout = timeout if isinstance(timeout, int | float) else None
            return None, transport_failure(exc, self.url, self.names, timeout, probe=self._network)


def _decode(answer: httpx.Response) -> Any:
    """The answer's JSON, or an error body holding its text."""
    try:
        return answer.json()
    except ValueError:
        return {"error": {"code": "", "message": answer.text[:500] or answer.reason_phrase}}


def _json(answer: httpx.Response) -> Any:
    """The answer's JSON, or None when it is not JSON."""
    try:
        return answer.json()
    except ValueError:
        return None


def _retried(answer: httpx.Response, body: Any) -> bool:
    """Whether a fedtune answer is retried: 5xx, 429, or a code of :data:`_RETRIED_CODES`."""
    if answer.is_server_error or answer.status_code == 429:
        return True
    return fedtune_body(body) and body["error"].get("code") in _RETRIED_CODES


def _retry_after(answer: httpx.Response) -> float:
    """The answer's ``Retry-After`` in seconds (0 without one, or with a date)."""
    try:
        return max(0.0, float(answer.headers.get("retry-after", "0")))
    except ValueError:
        return 0.0
