"""Bearer-token authentication of the ``/v1`` API (health, readiness and metrics stay open).

With ``FEDTUNE_API_TOKEN`` set, every ``/v1`` request needs ``Authorization: Bearer <token>``:
no or malformed header → 401 ``unauthorized`` (with ``WWW-Authenticate: Bearer``); a different
token → 403 ``forbidden``. Tokens are compared with ``hmac.compare_digest`` (constant time) and
never logged. Without a token the API is open (a local, single-user service).
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..errors import ForbiddenError, UnauthorizedError
from .deps import SettingsDep

__all__ = ["bearer", "require_token"]

bearer = HTTPBearer(auto_error=False, description="FEDTUNE_API_TOKEN, when the service sets one")


def require_token(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> None:
    expected = settings.token
    if expected is None:
        return
    if credentials is None or not credentials.credentials:
        raise UnauthorizedError("a bearer token is required (Authorization: Bearer <token>)")
    if not hmac.compare_digest(credentials.credentials.encode(), expected.encode()):
        raise ForbiddenError("the bearer token is not valid")
