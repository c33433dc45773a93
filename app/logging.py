"""Log set-up for the process. The library modules only log; this module configures.

Every line carries the process id, because several workers share one output.
"""

from __future__ import annotations

import logging

from .redact import redact

__all__ = ["configure_logging"]

_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"


class _RedactingFormatter(logging.Formatter):
    """Formats as usual, then redacts URL credentials from the whole line (and its
    traceback): a secret in an exception message is not printed either."""

    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure_logging(level: str) -> None:
    """Send app logs to stderr at ``level``; idempotent across repeated calls."""
    root = logging.getLogger()
    if not any(getattr(handler, "_regent", False) for handler in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(_RedactingFormatter(_FORMAT))
        handler._regent = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    logging.getLogger("app").setLevel(level)
    # Alembic announces its context on every schema check; that is noise at run time.
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    # httpx logs every request's full URL at INFO, credentials included.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    root.setLevel(min(logging.WARNING, logging.getLevelName(level)))
