"""URIs as the service may show them: no credentials, no local paths.

``redact_uri`` keeps ``scheme://host[:port]/path`` and drops user, password, query and fragment
(``https://user:secret@mlflow:5000/x?token=t`` → ``https://mlflow:5000/x``). A URI with no host —
a local store such as ``sqlite:////srv/fedtune/work/…/mlflow.db`` or a file path — names the
server's own disk, which tells a client nothing it can use: it becomes ``None``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fedtune.redact import bare_uri

__all__ = ["redact_uri"]


def redact_uri(uri: str | None) -> str | None:
    """``uri`` without credentials, query or fragment; ``None`` for a local store or path."""
    if not uri:
        return None
    try:
        parts = urlsplit(uri)
        host = parts.hostname
    except ValueError:
        return None
    if not parts.scheme or not host:
        return None
    return bare_uri(uri)
