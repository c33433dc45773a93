"""Turning a payload into JSON, with an error that names the field that is not."""

from __future__ import annotations

import json
from typing import Any

from .errors import PayloadError

__all__ = ["dump_payload"]


def dump_payload(outbox: str, payload: Any) -> str:
    """The payload as JSON text. Raises PayloadError naming the first bad field."""
    try:
        return json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError):
        path, value = _first_bad(payload, "payload")
        raise PayloadError(
            f"outbox {outbox!r}: {path} is {type(value).__name__} {value!r:.60}, which is "
            "not JSON; convert it (str(), float(), .isoformat()) before enqueueing"
        ) from None


def _first_bad(value: Any, path: str) -> tuple[str, Any]:
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} key {key!r}", key
            found = _first_bad(item, f"{path}[{key!r}]")
            if found[0]:
                return found
        return "", None
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            found = _first_bad(item, f"{path}[{index}]")
            if found[0]:
                return found
        return "", None
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return path, value
    return "", None
