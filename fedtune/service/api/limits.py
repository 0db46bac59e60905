"""Request body size limit (``FEDTUNE_MAX_REQUEST_BYTES``) answered as a JSON 413.

A ``Content-Length`` above the limit is refused before the body is read; a streamed (chunked)
body is counted as it arrives and the request fails with 413 once the limit is passed. The
error is an ``HTTPException`` so FastAPI's body parsing re-raises it and the service's handler
writes the usual ``{"error": {"code": "payload_too_large", ...}}``. ``per_path`` gives a path its
own limit and field (code uploads: ``FEDTUNE_MAX_CODE_BYTES``, field ``code``).
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BodySizeLimit"]


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body larger than {limit} bytes")


class BodySizeLimit:
    def __init__(
        self, app: ASGIApp, max_bytes: int, per_path: dict[str, tuple[int, str]] | None = None
    ) -> None:
        self.app, self.max_bytes, self.per_path = app, max_bytes, dict(per_path or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, field = self.per_path.get(scope.get("path", ""), (self.max_bytes, None))
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await self._refuse(scope, receive, send, limit, field)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, limit: int, field: str | None
    ) -> None:
        body = {
            "error": {
                "code": "payload_too_large",
                "message": f"request body larger than {limit} bytes",
                "field": field,
            }
        }
        await JSONResponse(body, status_code=413, headers={"Connection": "close"})(
            scope, receive, send
        )
