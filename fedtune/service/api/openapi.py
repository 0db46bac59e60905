"""The OpenAPI document, completed where FastAPI cannot see the contract.

* Every ``/v1`` operation documents the error answers it can give: 400 (malformed JSON), 401 (no
  or an invalid token), 403 (a viewer changing, a non-admin on an admin route), 413 (body over ``FEDTUNE_MAX_REQUEST_BYTES``) and 422 (invalid
  request, ``field`` = dotted path), all with the ``ErrorResponse`` body.
* ``POST /v1/studies`` reads its body as a plain object (``accept_spec`` validates it and names
  the dotted field), so FastAPI would document ``object``; the real schema is the study spec's,
  :class:`fedtune.tuning.spec.StudySpec`, added to ``components/schemas``; its description
  states this server's limits on a spec (``fedtune.service.spec_limits.describe_limits``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = ["ERROR_STATUSES", "install_openapi"]

ERROR_STATUSES: dict[str, str] = {
    "400": "malformed request (the body is not valid JSON)",
    "401": "no bearer token, or one that authenticates nobody (unknown, revoked, expired)",
    "403": "readable but not changeable by the caller (a viewer), or admins only",
    "413": "request body too large",
    "422": "invalid request (field = dotted path)",
}
_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}


def install_openapi(app: FastAPI, settings: Settings | None = None) -> None:
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            _document_errors(document)
            _study_spec_body(document)
            if settings is not None:
                _submission_limits(document, settings)
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document_errors(document: dict[str, Any]) -> None:
    for path, operations in document.get("paths", {}).items():
        if not path.startswith("/v1"):
            continue
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for status, description in ERROR_STATUSES.items():
                entry = responses.setdefault(str(status), {"description": description})
                entry["content"] = {"application/json": {"schema": _ERROR_REF}}


def _study_spec_body(document: dict[str, Any]) -> None:
    from fedtune.tuning.spec import StudySpec

    schema = StudySpec.model_json_schema(ref_template="#/components/schemas/{model}")
    components = document.setdefault("components", {}).setdefault("schemas", {})
    components.update(schema.pop("$defs", {}))
    components["StudySpec"] = schema
    body = document["paths"]["/v1/studies"]["post"].get("requestBody", {})
    for media in body.get("content", {}).values():
        examples = media.get("examples")
        media.clear()
        media["schema"] = {"$ref": "#/components/schemas/StudySpec"}
        if examples:
            media["examples"] = examples


def _submission_limits(document: dict[str, Any], settings: Settings) -> None:
    from ..spec_limits import describe_limits

    post = document["paths"]["/v1/studies"]["post"]
    post["description"] = f"{post.get('description', '').strip()}\n\n{describe_limits(settings)}"
