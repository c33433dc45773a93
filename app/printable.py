"""Text that came from data, made safe to print on a terminal or a log line.

Outbox keys, receivers' error bodies, job names and ids, host names: any of them can
carry control characters (ESC sequences that retitle or clear a terminal, BEL, CR and
LF that start a forged line, U+202E that reverses what follows). ``printable`` writes
each as a visible escape, so what data carries is shown, never obeyed. The CLI
(app/cli/, app/__main__.py) and the log formatter (app/logging.py) print
through it; the admin page's templates show every value through ``printable_text``
(line breaks kept), then HTML escaping.
"""

from __future__ import annotations

import re

__all__ = ["printable", "printable_text"]

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


# What a page's text shows as it is: its line breaks and tabs.
_UNPRINTABLE_IN_TEXT = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]"
)


def printable_text(value: str) -> str:
    """``value`` as ``printable`` writes it, but for its line breaks (LF, CR) and tabs,
    which a page lays out as text: for what the admin page shows, where U+202E would
    otherwise reverse what follows it on screen."""
    return _UNPRINTABLE_IN_TEXT.sub(_escape, value)


def printable(value: str) -> str:
    """``value`` with every control character (C0, DEL, C1, bidirectional controls, line
    and paragraph separators) written as a backslash escape (``\\x1b``, ``\\n``,
    ``\\u202e``): one line that moves no cursor. Other text, accents included, is kept."""
    return _UNPRINTABLE.sub(_escape, value)
