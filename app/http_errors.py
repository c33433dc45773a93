"""Error answers that cannot fail themselves.

The default 422 handler echoes the offending input and encodes it as UTF-8; a JSON body
with a lone surrogate (valid JSON, ``"\\ud800"``) then crashes the handler that reports
it, and a 10 MB body is echoed back whole. Here every error body is ASCII-escaped JSON,
and a validation error lists where and what, never the input.

The models below are those bodies, so the OpenAPI schema documents what is answered:
``ErrorBody`` for every refusal (401, 404, 409, 429), ``ValidationErrorBody`` for 422
(``documented_error_bodies`` puts it in place of FastAPI's default, which names
``input`` and ``ctx`` this handler never sends, and documents the 400 FastAPI answers
for a body it cannot parse).
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel

__all__ = [
    "ErrorBody",
    "FieldError",
    "SafeJSONResponse",
    "ValidationErrorBody",
    "documented_error_bodies",
    "error_response",
    "validation_error_response",
]


class ErrorBody(BaseModel):
    """A refusal's body (401, 404, 409, 429): what is wrong and what to do."""

    detail: str


class FieldError(BaseModel):
    """One invalid part of a request: where (``loc``, e.g. ``["query", "limit"]``) and
    what is wrong with it; never the value sent."""

    loc: list[str]
    msg: str
    type: str


class ValidationErrorBody(BaseModel):
    """A 422's body: each invalid part of the request."""

    detail: list[FieldError]


def error_response(description: str, *, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """A route's ``responses=`` entry for a refusal: an ErrorBody, ``description`` saying
    when it is answered, and the ``headers`` (name: what it says) it always carries."""
    entry: dict[str, Any] = {"model": ErrorBody, "description": description}
    if headers:
        entry["headers"] = {
            name: {"description": text, "required": True, "schema": {"type": "string"}}
            for name, text in headers.items()
        }
    return entry


class SafeJSONResponse(JSONResponse):
    """JSONResponse that escapes every non-ASCII character, so any str encodes."""

    def render(self, content: Any) -> bytes:
        """The content as ASCII JSON (``\\uXXXX`` escapes for the rest)."""
        return json.dumps(content, ensure_ascii=True, separators=(",", ":"), default=str).encode(
            "ascii"
        )


async def validation_error_response(request: Request, exc: Exception) -> SafeJSONResponse:
    """RequestValidationError -> 422 with each error's ``loc``, ``msg`` and ``type``."""
    assert isinstance(exc, RequestValidationError)
    body = ValidationErrorBody(
        detail=[
            FieldError(
                loc=[str(part) for part in error["loc"]], msg=error["msg"], type=error["type"]
            )
            for error in exc.errors()
        ]
    )
    return SafeJSONResponse(body.model_dump(), status_code=422)


def documented_error_bodies(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (an app's OpenAPI document) with the error answers every route gives
    whatever it declares: FastAPI's 422 body replaced by the ValidationErrorBody that
    validation_error_response answers (FastAPI documents a 422, by reference, on each
    route that takes parameters), and a 400 ErrorBody on each route that takes a body
    (FastAPI answers 400 for one it cannot parse: not JSON, not UTF-8)."""
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    if "HTTPValidationError" in schemas:
        body = ValidationErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(body.pop("$defs"))
        schemas.pop("ValidationError", None)
        schemas["HTTPValidationError"] = body
    unparseable = {
        "description": "the body cannot be parsed",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}},
    }
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if "requestBody" in operation:
                operation["responses"].setdefault("400", unparseable)
                schemas.setdefault("ErrorBody", ErrorBody.model_json_schema())
    return schema
