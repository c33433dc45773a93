"""The one error of the local PostgreSQL."""

from __future__ import annotations

__all__ = ["LocalPostgresError"]


class LocalPostgresError(Exception):
    """The local PostgreSQL cannot be started; the message says why and what to do."""
