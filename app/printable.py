"""Text that came from data, made safe to print on a terminal or a log line.

Outbox keys, receivers' error bodies, job names and ids, host names: any of them can
carry control characters (ESC sequences that retitle or clear a terminal, BEL, CR and
LF that start a forged line, U+202E that reverses what follows) and invisible ones (a
zero-width space, a soft hyphen, a BOM, tag characters that hide text): "invoice-42"
and "invoice-\\u200b42" are two keys that would look alike. ``printable`` writes each
as a visible escape, so what data carries is shown, never obeyed, and two values never
look the same. The CLI (app/cli/, app/__main__.py) and the log formatter
(app/logging.py) print through it; the admin page's templates show every value through
it, or through ``printable_text`` (line breaks kept) for an error's text, then HTML
escaping.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["printable", "printable_text"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Controls (Cc: C0, DEL, C1), format characters (Cf: the bidirectional controls,
# zero-width spaces and joiners, the soft hyphen, U+FEFF, tag characters), the line and
# paragraph separators (a new line to some terminals and viewers), private-use,
# surrogate and unassigned code points (shown as nothing, or as one box whatever they
# are).
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})
# Default-ignorable code points of other categories, which a font draws as nothing: the
# combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian free
# variation selectors, variation selectors.
_IGNORABLE = re.compile(
    "[\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180f\u3164\ufe00-\ufe0f\uffa0\U000e0100-\U000e01ef]"
)
# What may need an escape: anything but printable ASCII. The rest of ASCII is shown as it
# is, so most text is matched by nothing.
_CANDIDATE = re.compile("[^\x20-\x7e]")


def _hidden(char: str) -> bool:
    category = unicodedata.category(char)
    # A space other than U+0020 (no-break, en, em, thin, ideographic...) looks like one.
    return (
        category in _HIDDEN_CATEGORIES or category == "Zs" or _IGNORABLE.fullmatch(char) is not None
    )


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _shown(match: re.Match[str]) -> str:
    char = match.group()
    return _escape(char) if _hidden(char) else char


def _shown_in_text(match: re.Match[str]) -> str:
    char = match.group()
    return char if char in _NAMED or not _hidden(char) else _escape(char)


def printable_text(value: str) -> str:
    """``value`` as ``printable`` writes it, but for its line breaks (LF, CR) and tabs,
    which a page lays out as text: for an error's text on the admin page, where U+202E
    would otherwise reverse what follows it on screen."""
    return _CANDIDATE.sub(_shown_in_text, value)


def printable(value: str) -> str:
    """``value`` with every control character (C0, DEL, C1), format character (the
    bidirectional controls, zero-width ones, the soft hyphen, tag characters), line and
    paragraph separator, space other than U+0020, and private-use, surrogate or
    unassigned code point written as a backslash escape (``\\x1b``, ``\\n``, ``\\xa0``,
    ``\\u202e``, ``\\U000e0041``): one line that moves no cursor and hides nothing. Other
    text, accents included, is kept."""
    return _CANDIDATE.sub(_shown, value)
