"""``OPTIONS`` and ``405`` say every method a path has.

Starlette answers a request whose method a path lacks from the *first* route with that path:
``POST /v1/studies`` and ``GET /v1/studies`` are two routes, so ``OPTIONS /v1/studies`` got a 405
whose ``Allow`` listed ``GET, HEAD`` only. :class:`AllowedMethods` answers ``OPTIONS`` itself —
``204`` with ``Allow`` = the union over every route matching the path, plus ``OPTIONS`` — before
authentication (like a CORS preflight: it tells nothing about any one study, since a path with
an id matches whatever the id), and :func:`allowed_methods` gives the 405 handler the same list.
"""

from __future__ import annotations

from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["AllowedMethods", "allowed_methods"]


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed_methods(app: ASGIApp, scope: Scope) -> list[str]:
    """Every method some route serves at ``scope``'s path (sorted; empty: no such path).

    Each method is tried against each route's own ``matches`` (routers included lazily by
    FastAPI are routes too), so this follows whatever the router would dispatch."""
    routes = getattr(getattr(app, "router", None), "routes", ())
    methods = {
        method
        for method in _METHODS
        if any(route.matches({**scope, "method": method})[0] == Match.FULL for route in routes)
    }
    if methods:
        methods.add("OPTIONS")
    return sorted(methods)


class AllowedMethods:
    """ASGI middleware: ``OPTIONS <path>`` → 204 with the path's ``Allow`` (404 when none)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        methods = allowed_methods(scope["app"], scope)
        if not methods:
            await self.app(scope, receive, send)  # no such path: the router's 404
            return
        headers = [(b"allow", ", ".join(methods).encode()), (b"content-length", b"0")]
        await send({"type": "http.response.start", "status": 204, "headers": headers})
        await send({"type": "http.response.body", "body": b""})
