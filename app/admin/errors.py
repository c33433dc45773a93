"""Admin errors: each carries the HTTP status it answers with and a message that names
the problem."""

from __future__ import annotations

__all__ = ["AdminError", "Conflict", "NotFound"]


class AdminError(Exception):
    """Root of the admin errors; ``status`` is the HTTP answer."""

    status = 400


class NotFound(AdminError):
    """An unknown job, outbox or message."""

    status = 404


class Conflict(AdminError):
    """The request is valid but the state forbids it (a running job, a delivered row, a
    row a drain is delivering)."""

    status = 409
