"""Turning a payload into the JSON text a jsonb column stores, or a PayloadError that
names the field which cannot be, and why.

The common case costs one ``json.dumps`` and a few scans of its text in C. Only when
that fails, or the text may hold something jsonb refuses (a NUL, a lone surrogate) or
may nest too deep (more brackets than MAX_PAYLOAD_DEPTH: a payload of over 500 lists
and objects is walked on every enqueue), is the payload walked, iteratively (a walk
cannot overflow the stack), to check it and name the first bad field.
"""

from __future__ import annotations

import json
import reprlib
from typing import Any

from app.storable import is_storable_text

from .errors import PayloadError

__all__ = ["MAX_PAYLOAD_DEPTH", "dump_payload"]

MAX_PAYLOAD_DEPTH = 500
"""The deepest nesting of lists and objects a payload may have. The drain decodes each
claimed payload with json.loads, which stops at Python's recursion limit (1000 frames,
less the drain's own): a payload nested some 990 deep would be stored and then fail
every claim of its outbox. 500 leaves the drain room, and is far past any message's
(PostgreSQL's jsonb itself takes some thousands)."""

_OPENERS = ("[", "{")


def dump_payload(outbox: str, payload: Any) -> str:
    """The payload as JSON text jsonb accepts. Raises PayloadError naming the first bad
    field: a value that is not JSON (or NaN), a string or key with a NUL character or a
    lone surrogate, a list or dict that contains itself, nesting past
    MAX_PAYLOAD_DEPTH."""
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _refusal(outbox, payload, exc) from None
    # Superset checks: an escaped NUL, any non-UTF-8 text, or enough brackets (in
    # strings too) to nest that deep. The walk decides.
    suspect = (
        "\\u0000" in text
        or not (text.isascii() or is_storable_text(text))
        or sum(text.count(opener) for opener in _OPENERS) > MAX_PAYLOAD_DEPTH
    )
    if suspect:
        problem = _first_problem(payload)
        if problem is not None:
            raise PayloadError(f"outbox {outbox!r}: {problem}")
    return text


def _refusal(outbox: str, payload: Any, exc: BaseException) -> PayloadError:
    problem = _first_problem(payload)
    if problem is None:  # what json refused is not a field's type (an int too long)
        problem = f"payload is not JSON ({exc}); convert it before enqueueing"
    return PayloadError(f"outbox {outbox!r}: {problem}")


def _first_problem(payload: Any) -> str | None:
    """What is wrong with the first bad field of ``payload``, in document order, or None."""
    # Depth-first, iteratively; an "exit" entry takes a container off the path that a
    # cycle is looked for in.
    stack: list[tuple[bool, Any, str, int]] = [(True, payload, "payload", 1)]
    on_path: set[int] = set()
    while stack:
        entering, value, path, depth = stack.pop()
        if not entering:
            on_path.discard(id(value))
            continue
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem is not None:
                return f"{path} {problem}"
            continue
        if value is None or isinstance(value, bool | int):
            continue
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                return f"{path} is float {value!r}, which is not JSON; send null or a string"
            continue
        if not isinstance(value, dict | list | tuple):
            return (
                f"{path} is {type(value).__name__} {reprlib.repr(value)}, which is not JSON;"
                " convert it (str(), float(), .isoformat()) before enqueueing"
            )
        if id(value) in on_path:
            return (
                f"{path} contains itself (a reference cycle), which JSON cannot hold;"
                " enqueue a copy without the cycle"
            )
        if depth > MAX_PAYLOAD_DEPTH:
            return (
                f"{path[:120]}... nests more than {MAX_PAYLOAD_DEPTH} lists and objects"
                " deep (MAX_PAYLOAD_DEPTH); flatten it"
            )
        on_path.add(id(value))
        stack.append((False, value, path, depth))
        children: list[tuple[bool, Any, str, int]] = []
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str):
                    problem = _text_problem(key)
                    if problem is not None:
                        return f"{path} key {key!r} {problem}"
                elif not (key is None or isinstance(key, bool | int | float)):
                    return (
                        f"{path} key {reprlib.repr(key)} is {type(key).__name__}, which a"
                        " JSON object cannot have; use str keys"
                    )
                children.append((True, item, f"{path}[{key!r}]", depth + 1))
        else:
            children = [
                (True, item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)
            ]
        stack.extend(reversed(children))
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return (
            "contains a NUL character (\\x00), which PostgreSQL cannot store;"
            " remove it, or encode binary data (base64)"
        )
    if not is_storable_text(text):
        return (
            "contains a lone UTF-16 surrogate, which is not valid UTF-8 and PostgreSQL"
            " cannot store; decode the bytes it came from with errors='replace'"
        )
    return None
