"""Request body size limit (``FEDTUNE_MAX_REQUEST_BYTES``) answered as a JSON 413.

A ``Content-Length`` above the limit is refused before the body is read; a streamed (chunked)
body is counted as it arrives and the request fails with 413 once the limit is passed. The
error is an ``HTTPException`` so FastAPI's body parsing re-raises it and the service's handler
writes the usual ``{"error": {"code": "payload_too_large", ...}}``.
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
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, counted, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = {
            "error": {
                "code": "payload_too_large",
                "message": f"request body larger than {self.max_bytes} bytes",
                "field": None,
            }
        }
        await JSONResponse(body, status_code=413, headers={"Connection": "close"})(
            scope, receive, send
        )
