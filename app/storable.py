"""Values PostgreSQL can store: the limits of its integer columns, checks that text
fits a text column, and text made storable by escaping.

A number past the column's type or a string with a NUL byte or a lone surrogate makes
the driver raise (inside a handler: a 500). Routes and models declare the types of
storable_types.py, so the same value is a 422 that names the field, before any query
runs. Text the code writes itself (an error message quoting raw bytes) is escaped
instead (escape_unstorable). No pydantic here: the scheduler's engine escapes its
errors with this module and runs without it.
"""

from __future__ import annotations

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "JSON_INT_MAX",
    "escape_unstorable",
    "is_int64",
    "is_storable_text",
    "storable_text",
]

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
JSON_INT_MAX = 2**53 - 1
"""The largest integer every JSON reader holds exactly (RFC 8259, section 6): past it a
client that reads numbers as doubles (JavaScript, and many schema validators) rounds."""


def is_int64(value: int) -> bool:
    """True when ``value`` fits a PostgreSQL bigint."""
    return -INT64_MAX - 1 <= value <= INT64_MAX


def is_storable_text(value: str) -> bool:
    """True when PostgreSQL can store ``value`` in a text column: no NUL, valid UTF-8."""
    if "\x00" in value:
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable_text(value: str) -> str:
    """Return ``value``; raise ValueError naming the problem when it cannot be stored."""
    if not is_storable_text(value):
        raise ValueError("must not contain a NUL character or a lone UTF-16 surrogate")
    return value


def escape_unstorable(value: str) -> str:
    """``value`` with what a PostgreSQL text column refuses (NUL, lone surrogates)
    written as backslash escapes."""
    value = value.replace("\x00", "\\x00")
    return value.encode("utf-8", "backslashreplace").decode("utf-8")
