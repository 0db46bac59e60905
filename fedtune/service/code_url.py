"""Per-study credentials for a study's code package: ``GET /v1/studies/{id}/code.zip?token=…``.

A RayJob fetches its study's ``code:`` package over HTTP (Ray's ``working_dir`` remote URI) and
cannot carry the API's bearer token (the manifest is readable by whoever can read RayJobs).
It gets a URL with its own credential instead:

    token = HMAC-SHA256(key, "fedtune-code:<study id>:<package sha256>")   (hex)

valid for that study's package only — never the API, never another study. The key is
``FEDTUNE_CODE_URL_KEY``; else derived from ``FEDTUNE_API_TOKEN`` (HMAC of a fixed label, so the
token itself never appears in a URL); else a random key created once in
``<FEDTUNE_WORKDIR>/code-url.key`` (mode 0600), so URLs stay valid across restarts.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from .settings import Settings

__all__ = ["code_token", "code_uri", "code_url_key", "verify_code_token"]

_LABEL = b"fedtune code url key v1"


def code_url_key(settings: Settings) -> bytes:
    if settings.code_url_key is not None:
        return settings.code_url_key.get_secret_value().encode()
    if settings.token:
        return hmac.new(settings.token.encode(), _LABEL, hashlib.sha256).digest()
    path = Path(settings.workdir).resolve() / "code-url.key"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another process created it meanwhile
        else:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
    return path.read_text().strip().encode()


def code_token(key: bytes, study_id: str, sha256: str) -> str:
    return hmac.new(key, f"fedtune-code:{study_id}:{sha256}".encode(), hashlib.sha256).hexdigest()


def verify_code_token(key: bytes, study_id: str, sha256: str, token: str) -> bool:
    return hmac.compare_digest(code_token(key, study_id, sha256).encode(), token.encode())


def code_uri(settings: Settings, study_id: str, sha256: str) -> str:
    """The URL a RayJob downloads its study's package from (needs ``FEDTUNE_PUBLIC_URL``)."""
    if not settings.public_url:
        from fedtune.errors import BackendError

        raise BackendError(
            "a study with uploaded code needs FEDTUNE_PUBLIC_URL (the service's URL as RayJobs "
            "reach it) to serve the package to its RayJob"
        )
    token = code_token(code_url_key(settings), study_id, sha256)
    return f"{settings.public_url}/v1/studies/{study_id}/code.zip?token={token}"
