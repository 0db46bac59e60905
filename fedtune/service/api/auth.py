"""Authentication of the ``/v1`` API: who is calling (health, readiness and metrics stay open).

With ``FEDTUNE_API_TOKEN`` set, every ``/v1`` request needs ``Authorization: Bearer <token>``,
one of:

* ``FEDTUNE_API_TOKEN`` itself — the bootstrap admin (``admin``), so deployments from before
  users existed keep working;
* a user's API token (``ftk_…``, :mod:`fedtune.service.identity`): stored only as a hash,
  refused once revoked or expired, or its user disabled;
* with ``FEDTUNE_OIDC_ISSUER`` set, a JWT from that identity provider
  (:mod:`fedtune.service.oidc`).

No or malformed header → 401 ``unauthorized``; a token that is none of these (unknown, revoked,
expired, a bad signature) → 401 ``invalid_token``; both with ``WWW-Authenticate: Bearer``. The
bootstrap token is compared with ``hmac.compare_digest``; no token is ever logged. Without
``FEDTUNE_API_TOKEN`` or an issuer the API is open — ``fedtune serve`` runs so only when told to
(``--insecure-open``, loopback only: :mod:`..admin_token`): a caller without a token is an
anonymous admin, each such request's log line says that tokens are not checked, and a token
that is sent anyway is checked all the same (a user's is used, an unknown one is 401), so nobody
is silently someone else.

The check runs in :class:`BearerAuth`, an ASGI middleware, *before* the body is read or parsed:
an unauthenticated client learns nothing about the body it sent (no 400/413/422 before 401) and
costs the server no parsing. It leaves the caller (:class:`~fedtune.service.access.Principal`)
in the request's state; :data:`Caller` hands it to the routes, which authorize
(:mod:`fedtune.service.access`), and declares the bearer scheme for OpenAPI.

Two kinds of path carry their own credential instead: ``GET /v1/studies/<id>/code.zip?token=…``,
a study's code package for its RayJob, authorised per study (``fedtune/service/code_url.py``),
and ``/v1/driver/studies/<id>/…``, where a study's driver reports with a token of that study's
dispatch attempt (``fedtune/service/api/routes_driver.py``).
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ..access import ANONYMOUS_ADMIN, Principal
from ..admin_token import OPEN
from ..errors import InvalidTokenError, UnauthorizedError, error_body, status_and_code

__all__ = ["PROTECTED_PREFIX", "BearerAuth", "Caller", "bearer", "current_principal"]

log = logging.getLogger(__name__)

PROTECTED_PREFIX = "/v1"
#: (method, path) authorised by a credential of their own, not the bearer token
OWN_CREDENTIAL = (
    ("GET", re.compile(r"^/v1/studies/[0-9a-f]{12}/code\.zip$")),
    (None, re.compile(r"^/v1/driver/studies/[0-9a-f]{12}(/|$)")),
)
BOOTSTRAP = Principal("admin", admin=True, via="bootstrap")
bearer = HTTPBearer(
    auto_error=False,
    description="FEDTUNE_API_TOKEN (bootstrap admin), a user's "
    "API token (fedtune users create) or an OIDC JWT",
)

#: a bearer token -> its caller, or None (a user token looked up in the database, an OIDC JWT)
Resolver = Callable[[str], Principal | None]


def bearer_token(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or ``UnauthorizedError``."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthorizedError("a bearer token is required (Authorization: Bearer <token>)")
    return token.strip()


def authenticate(bootstrap: str | None, authorization: str | None, resolve: Resolver) -> Principal:
    """The caller a request's ``Authorization`` header names (see the module docstring);
    ``bootstrap`` None: no bootstrap token (users' tokens or OIDC only)."""
    token = bearer_token(authorization)
    if bootstrap is not None and hmac.compare_digest(token.encode(), bootstrap.encode()):
        return BOOTSTRAP
    principal = resolve(token)
    if principal is None:
        raise InvalidTokenError("the bearer token is not valid (unknown, revoked or expired)")
    return principal


class BearerAuth:
    """Authenticate ``/v1`` requests before anything reads the body (401 otherwise)."""

    def __init__(
        self, app: ASGIApp, token: str | None, resolve: Resolver, required: bool | None = None
    ) -> None:
        self.app, self.token, self.resolve = app, token, resolve
        #: authentication is on with a bootstrap token or an OIDC issuer; else the API is open
        self.required = token is not None if required is None else required

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        own = any(m in (None, scope.get("method")) and p.match(path) for m, p in OWN_CREDENTIAL)
        if not own and (path == PROTECTED_PREFIX or path.startswith(PROTECTED_PREFIX + "/")):
            raw = dict(scope["headers"]).get(b"authorization")
            header = raw.decode("latin-1") if raw is not None else None
            try:
                if not self.required and not header:
                    principal = ANONYMOUS_ADMIN
                    log.info("%s: %s %s", OPEN, scope.get("method"), path)
                else:  # a user token is a database lookup: off the event loop
                    principal = await run_in_threadpool(
                        authenticate, self.token, header, self.resolve
                    )
            except UnauthorizedError as exc:
                status, _ = status_and_code(exc)
                answer = JSONResponse(
                    error_body(exc), status_code=status, headers={"WWW-Authenticate": "Bearer"}
                )
                await answer(scope, receive, send)
                return
            scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The caller :class:`BearerAuth` authenticated (``credentials``: the scheme, for OpenAPI)."""
    principal = getattr(request.state, "principal", None)
    if principal is None:  # a route outside /v1 asked for it: nobody authenticated
        raise UnauthorizedError("a bearer token is required (Authorization: Bearer <token>)")
    return principal


Caller = Annotated[Principal, Depends(current_principal)]
