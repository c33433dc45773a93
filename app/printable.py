"""Text that came from data, made safe to print on a terminal or a log line.

Outbox keys, receivers' error bodies, job names and ids, host names: any of them can
carry control characters (ESC sequences that retitle or clear a terminal, BEL, CR and
LF that start a forged line, U+202E that reverses what follows). ``printable`` writes
each as a visible escape, so what data carries is shown, never obeyed. The CLI
(app/cli/, app/__main__.py) and the log formatter (app/logging.py) print
through it; the admin page needs nothing more than HTML escaping.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0, DEL and C1 controls; the bidirectional overrides, embeddings, isolates and marks;
# the line and paragraph separators (a new line to some terminals and viewers).
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: str) -> str:
    """``value`` with every control character (C0, DEL, C1, bidirectional controls, line
    and paragraph separators) written as a backslash escape (``\\x1b``, ``\\n``,
    ``\\u202e``): one line that moves no cursor. Other text, accents included, is kept."""
    return _UNPRINTABLE.sub(_escape, value)
