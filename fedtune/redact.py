"""Credentials out of what fedtune records (issue 20 req. 2, issue 24 item 6).

:func:`strip_credentials` removes the user, password, query and fragment of a URI
(``https://user:secret@mlflow:5000/x?token=t`` → ``https://mlflow:5000/x``) and leaves anything
that is not a URI alone; :func:`scrub` applies it to every string of a nested spec. MLflow's
params and the ``spec.yaml`` artifact of a study go through it, so a tracking URI with
credentials in a spec never reaches MLflow. Pure Python: the SDK may use it too.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = ["bare_uri", "scrub", "strip_credentials"]

_UNPARSED = "<a URI that could not be parsed>"


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


def scrub(data: Any) -> Any:
    """``data`` (mappings, lists, strings) with :func:`strip_credentials` on every string."""
    if isinstance(data, str):
        return strip_credentials(data)
    if isinstance(data, dict):
        return {k: scrub(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [scrub(v) for v in data]
    return data
