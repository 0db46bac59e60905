"""Credentials out of what fedtune records.

:func:`strip_credentials` removes the user, password, query and fragment of a URI
(``https://user:secret@mlflow:5000/x?token=t`` → ``https://mlflow:5000/x``) and leaves anything
that is not a URI alone; :func:`scrub` applies it to every string of a nested spec. MLflow's
params and the ``spec.yaml`` artifact of a study go through it, so a tracking URI with
credentials in a spec never reaches MLflow. :func:`scrub_text` masks the credentials of every
URI inside free text (an error message, a log line, a traceback), and the credential of every
``Authorization`` header, ``Bearer`` token and ``password`` field written in it; :func:`mask`
also removes secrets known by value (a client's own token). Pure Python: the SDK uses it too.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "bare_uri",
    "mask",
    "scrub",
    "scrub_text",
    "scrubbing_log_handlers",
    "strip_credentials",
]

_UNPARSED = "<a URI that could not be parsed>"

#: ``scheme://user[:password]@`` inside text: the scheme, then the userinfo up to its ``@``
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^\s/?#@]+@")
#: ``Bearer <credential>`` / ``Basic <credential>``, as a header writes it (and httpx and h11 quote
#: it in their errors); eight characters at least, so that prose ("Bearer <token>") stays
_SCHEME = re.compile(r"\b(Bearer|Basic)(\s+)[^\s'\"<>,;]{8,}")
#: ``"password": "<value>"`` (JSON, a dict's repr) and ``Authorization: <value>`` without a scheme
_QUOTED = re.compile(
    r"(?i)([\"'](?:authorization|password|passwd|token|access_token)[\"']\s*:\s*[\"'])"
    r"(?!(?:Bearer|Basic)\s)([^\"']+)"
)
_HEADER = re.compile(r"(?i)\b(authorization\s*:\s*)(?!(?:Bearer|Basic)\s)(?!\*\*\*)([^\s'\",;]+)")
#: a fedtune API token, ``ftk_<id>_<secret>``: its public id stays, its secret goes
_FTK = re.compile(r"\b(ftk_[0-9a-f]{12}_)[A-Za-z0-9_-]+")
#: ``password=<value>`` / ``token=<value>`` in a query or a form
_ASSIGNED = re.compile(r"(?i)((?:^|[?&;\s])(?:password|passwd|token|access_token)=)([^\s&'\"#]+)")


def bare_uri(uri: str) -> str | None:
    """``scheme://host[:port]/path`` of ``uri``: user, password, query and fragment dropped;
    None when it cannot be parsed."""
    try:
        parts = urlsplit(uri)
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    netloc = (f"[{host}]" if host and ":" in host else host or "") + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def strip_credentials(value: str) -> str:
    """``value`` without the credentials (and query) of a URI; other strings unchanged."""
    if "://" not in value:
        return value
    try:
        parts = urlsplit(value)
    except ValueError:
        return _UNPARSED
    if parts.username is None and parts.password is None and not parts.query:
        return value
    return bare_uri(value) or _UNPARSED


def scrub_text(text: str) -> str:
    """Mask the user and password of every ``scheme://user:password@host`` inside free text.

    Args:
        text: Any text: an error message, a log line, a traceback.

    Returns:
        ``text`` with each URI's userinfo replaced by ``***``
        (``http://u:pw@host/x`` → ``http://***@host/x``; an address without a scheme,
        ``a@b.com``, is left alone), each ``Bearer <token>`` as ``Bearer ***``, and the value
        of each ``Authorization:`` header, the secret of each ``ftk_<id>_<secret>`` token, quoted ``"password": …`` or ``"token": …`` field and
        ``password=`` or ``token=`` parameter as ``***``.
    """
    text = _USERINFO.sub(r"\1***@", text)
    text = _FTK.sub(r"\1***", text)
    text = _SCHEME.sub(r"\1\2***", text)
    text = _QUOTED.sub(r"\1***", text)
    text = _HEADER.sub(r"\1***", text)
    return _ASSIGNED.sub(r"\1***", text)


def mask(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove known secrets, then every credential :func:`scrub_text` finds, from ``text``.

    Args:
        text: An error message, a traceback.
        secrets: Values that must not appear (a token, a password); None and "" are skipped.

    Returns:
        ``text`` with each secret (and its ``repr``'s inside, as ``b'…'`` quotes it) as ``***``.
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, "***")
        # as a str's or a bytes' repr writes it (escaped, UTF-8 encoded)
        for quoted in (repr(secret)[1:-1], repr(secret.encode("utf-8", "replace"))[2:-1]):
            if quoted != secret:
                text = text.replace(quoted, "***")
    return scrub_text(text)


def scrub(data: Any) -> Any:
    """``data`` (mappings, lists, strings) with :func:`strip_credentials` on every string."""
    if isinstance(data, str):
        return strip_credentials(data)
    if isinstance(data, dict):
        return {k: scrub(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [scrub(v) for v in data]
    return data


class _ScrubbingFormatter(logging.Formatter):
    """A handler's formatter whose output (message and traceback) shows no URI's password."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self.inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return scrub_text(self.inner.format(record))


def scrubbing_log_handlers(handlers: list[logging.Handler]) -> None:
    """Make ``handlers`` write their records through :func:`scrub_text`.

    Args:
        handlers: The handlers the driver logs to (its log file is their stream).
    """
    for handler in handlers:
        if not isinstance(handler.formatter, _ScrubbingFormatter):
            handler.setFormatter(_ScrubbingFormatter(handler.formatter))
