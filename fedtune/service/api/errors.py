"""Exception handlers: every error answer is ``{"error": {"code", "message", "field"}}``.

Service errors use the table in ``fedtune/wire.py``; a body that is not JSON is 400
``bad_request``; request validation errors become 422 ``invalid_request`` with the offending
field (``query.limit``, ``body``); framework HTTP
errors keep their status with a code (404 ``not_found``, 405 ``method_not_allowed``, 413
``payload_too_large``). Unexpected exceptions are logged and answered 500 ``internal_error``
without details. A 401 carries ``WWW-Authenticate: Bearer``; every 503 ``Retry-After``.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fedtune.errors import FedtuneError

from ..errors import UnauthorizedError, error_body, retry_after, status_and_code
from .allow import allowed_methods

__all__ = ["install_error_handlers"]

log = logging.getLogger(__name__)
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def _answer(status: int, code: str, message: str, field: str | None = None, headers=None):
    body = {"error": {"code": code, "message": message, "field": field}}
    return JSONResponse(body, status_code=status, headers=headers)


async def _fedtune_error(request: Request, exc: Exception) -> JSONResponse:
    status, code = status_and_code(exc)
    if status >= 500:
        log.warning("%s %s -> %d %s", request.method, request.url.path, status, exc)
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(exc, UnauthorizedError) else None
    if status == 503 or code == "submission_in_progress":  # says when to come back
        headers = {"Retry-After": retry_after(code)}
    return JSONResponse(error_body(exc), status_code=status, headers=headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(p) for p in first.get("loc", ())]
    field = ".".join(loc) if loc else None
    if first.get("type") == "json_invalid":  # not JSON at all: malformed, not invalid
        return _answer(400, "bad_request", f"malformed JSON: {first.get('msg')}", field)
    return _answer(422, "invalid_request", str(first.get("msg", "invalid request")), field)


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    headers = dict(getattr(exc, "headers", None) or {})
    if exc.status_code == 405:  # every method of the path, not only the first route's
        headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope))
    if exc.status_code == 503:
        headers.setdefault("Retry-After", retry_after(code))
    return _answer(exc.status_code, code, str(exc.detail), None, headers or None)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path)
    return _answer(500, "internal_error", "internal server error")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FedtuneError, _fedtune_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
