"""Secrets out of URLs before they are printed, logged or stored.

A receiver URL may carry credentials (``https://user:pass@host/``) or a token in its
query (``?token=...``, ``?X-Amz-Signature=...``); so may a receiver's error body that
echoes its request line. Whatever shows or keeps such text (an outbox row's
``last_error``, a log line, a CLI table) passes it through :func:`redact` first.
"""

from __future__ import annotations

import re

__all__ = ["redact"]

# Up to the LAST "@" before the host, as URL parsers read it: a password may hold "@".
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#\s]*@")
# A parameter whose name says it is a secret; over-redacting a "monkey=" is harmless.
_SECRET_PARAMETER = re.compile(
    r"(?i)\b([\w.-]*(?:token|key|password|passwd|pwd|secret|signature|sig|credential|auth)"
    r"[\w.-]*)=([^&\s\"'#;,]+)"
)


def redact(text: str) -> str:
    """``text`` with every URL's userinfo and every secret-named parameter's value
    replaced by ``***``; the rest (scheme, host, port, path) is kept for diagnosis."""
    text = _USERINFO.sub(r"\1***@", text)
    return _SECRET_PARAMETER.sub(r"\1=***", text)
