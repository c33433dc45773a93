"""Log set-up for the process. The library modules only log; this module configures.

Every line carries the process id, because several workers share one output. One event
is one line: its message, which may quote data (an outbox key, a receiver's error
body), is printed through app/printable.py, so a CR or LF in it cannot start a forged
line and an escape sequence cannot reach the terminal; a traceback follows on lines of
its own, indented and escaped the same way.

uvicorn's own loggers (``uvicorn.error``, ``uvicorn.access``) keep uvicorn's handlers and
formatters (its colours, its access line), configured before the app is imported; a
filter on them escapes what their records carry (a client address a proxy forwarded, a
request path) and writes a traceback on indented escaped lines the same way.
"""

from __future__ import annotations

import logging
import re
import traceback

from .printable import printable
from .redact import redact

__all__ = ["configure_logging"]

_FORMAT = "%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"
_INDENT = "    "


class _LineFormatter(logging.Formatter):
    """One line per event, escaped (printable) and with URL credentials redacted (a
    secret in an exception message is not printed either); the traceback, if any, on
    indented lines below it."""

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        if self.usesTime():
            record.asctime = self.formatTime(record, self.datefmt)
        lines = [printable(redact(self.formatMessage(record)))]
        details = []
        if record.exc_info:
            details.append(self.formatException(record.exc_info))
        if record.stack_info:
            details.append(self.formatStack(record.stack_info))
        for detail in details:
            lines.append(_indented(detail))
        return "\n".join(lines)


def _indented(detail: str) -> str:
    """A traceback (or stack) as the lines below its event: redacted, each escaped and
    indented, so none can pass for an event of its own."""
    return "\n".join(_INDENT + printable(line) for line in redact(detail).splitlines())


# The secret segment of an admin session's path (app/admin/session.py): a log line
# tells which screen was asked for, never under which session's path.
_SESSION_PATH = re.compile(r"(/admin/s/)[^/?#\s]+")


def _shown(value: object) -> object:
    if not isinstance(value, str):
        return value
    return printable(_SESSION_PATH.sub(r"\1***", value))


class _EscapeData(logging.Filter):
    """Escapes, in place, the data a record of another library's logger carries (its
    message's arguments, its traceback) before that logger's own formatter sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_shown(arg) for arg in record.args)
        elif isinstance(record.args, dict):
            record.args = {name: _shown(arg) for name, arg in record.args.items()}
        if isinstance(record.msg, str):
            # uvicorn ends some messages with a newline of its own.
            record.msg = printable(record.msg.rstrip("\n"))
        if record.exc_info and not record.exc_text:
            # The formatter prints exc_text as it is, on the lines after the message.
            record.exc_text = _indented("".join(traceback.format_exception(*record.exc_info)))
        return True


_ESCAPE_DATA = _EscapeData()
_UVICORN_LOGGERS = ("uvicorn.error", "uvicorn.access")


def configure_logging(level: str) -> None:
    """Send app logs to stderr at ``level``, and escape the data of uvicorn's own log
    lines (whatever handlers uvicorn gave them); idempotent across repeated calls."""
    root = logging.getLogger()
    if not any(getattr(handler, "_regent", False) for handler in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(_LineFormatter(_FORMAT))
        handler._regent = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    logging.getLogger("app").setLevel(level)
    # Jobs' and services' own log lines (ctx.log): regent.job.<id>, regent.service.<id>.
    logging.getLogger("regent").setLevel(level)
    # Alembic announces its context on every schema check; that is noise at run time.
    logging.getLogger("alembic.runtime.migration").setLevel(logging.WARNING)
    # httpx logs every request's full URL at INFO, credentials included.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for name in _UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        if _ESCAPE_DATA not in logger.filters:
            logger.addFilter(_ESCAPE_DATA)
    root.setLevel(min(logging.WARNING, logging.getLevelName(level)))
