"""Bearer-token authentication of the ``/v1`` API (health, readiness and metrics stay open).

With ``FEDTUNE_API_TOKEN`` set, every ``/v1`` request needs ``Authorization: Bearer <token>``:
no or malformed header → 401 ``unauthorized`` (with ``WWW-Authenticate: Bearer``); a different
token → 403 ``forbidden``. Tokens are compared with ``hmac.compare_digest`` (constant time) and
never logged. Without a token the API is open (a local, single-user service).

The check runs in :class:`BearerAuth`, an ASGI middleware, *before* the body is read or parsed:
an unauthenticated client learns nothing about the body it sent (no 400/413/422 before 401) and
costs the server no parsing. :func:`require_token` declares the scheme on the routes for OpenAPI
and checks again with the same :func:`verify`.

One path carries its own credential instead: ``GET /v1/studies/<id>/code.zip?token=…``, a
study's code package for its RayJob, authorised per study (``fedtune/service/code_url.py``).
"""

from __future__ import annotations

import hmac
import re
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ForbiddenError, UnauthorizedError, error_body, status_and_code
from .deps import SettingsDep

__all__ = ["PROTECTED_PREFIX", "BearerAuth", "bearer", "require_token", "verify"]

PROTECTED_PREFIX = "/v1"
#: (method, path) authorised by a credential of their own, not the bearer token
OWN_CREDENTIAL = (("GET", re.compile(r"^/v1/studies/[0-9a-f]{12}/code\.zip$")),)
bearer = HTTPBearer(auto_error=False, description="FEDTUNE_API_TOKEN, when the service sets one")


def verify(expected: str | None, authorization: str | None) -> None:
    """Raise ``UnauthorizedError``/``ForbiddenError`` unless ``authorization`` (the header) carries
    the ``expected`` bearer token; nothing is required when ``expected`` is None."""
    if expected is None:
        return
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthorizedError("a bearer token is required (Authorization: Bearer <token>)")
    if not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise ForbiddenError("the bearer token is not valid")


def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    header = f"Bearer {credentials.credentials}" if credentials is not None else None
    verify(settings.token, header)


class BearerAuth:
    """Answer 401/403 for ``/v1`` requests without the token before anything reads the body."""

    def __init__(self, app: ASGIApp, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        own = any(scope.get("method") == m and p.match(path) for m, p in OWN_CREDENTIAL)
        if self.token is not None and not own and (path == PROTECTED_PREFIX or
                                                   path.startswith(PROTECTED_PREFIX + "/")):  # fmt: skip
            headers = dict(scope["headers"])
            raw = headers.get(b"authorization")
            try:
                verify(self.token, raw.decode("latin-1") if raw is not None else None)
            except (UnauthorizedError, ForbiddenError) as exc:
                status, _ = status_and_code(exc)
                extra = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
                answer = JSONResponse(error_body(exc), status_code=status, headers=extra)
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)
