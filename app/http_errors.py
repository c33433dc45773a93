"""Error answers that cannot fail themselves.

The default 422 handler echoes the offending input and encodes it as UTF-8; a JSON body
with a lone surrogate (valid JSON, ``"\\ud800"``) then crashes the handler that reports
it, and a 10 MB body is echoed back whole. Here every error body is ASCII-escaped JSON,
and a validation error lists where and what, never the input.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

__all__ = ["SafeJSONResponse", "validation_error_response"]


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
    detail = [
        {"loc": [str(part) for part in error["loc"]], "msg": error["msg"], "type": error["type"]}
        for error in exc.errors()
    ]
    return SafeJSONResponse({"detail": detail}, status_code=422)
