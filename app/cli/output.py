"""What an operator command prints: plain tables that read like the admin page, JSON
for scripts, and the print itself, which a closed pipe ends quietly.

Every value from data goes through app/printable.py, in a table and in a stored text
printed whole, so a control character is shown as an escape, never sent to the
terminal; JSON escapes them itself.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ..operations import display
from ..printable import printable, printable_name

__all__ = ["block", "print_output", "table", "to_json"]


def _cell(value: Any) -> str:
    if isinstance(value, datetime):
        return display.timestamp(value)
    if isinstance(value, bool):
        return display.yes_no(value)
    if isinstance(value, dict | list):
        return printable(json.dumps(value, default=str)[:60])
    # A key, id or name is shown whole (its line breaks, and the spaces a column's
    # padding would hide, escaped): two that differ must look different. A stored error
    # is summed up by its caller (display.error_summary).
    return "" if value is None else printable_name(str(value))


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned columns, one line each: every text whole, its control characters
    (line breaks too) escaped."""
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def to_json(value: Any) -> str:
    """``value`` as indented ASCII JSON, timestamps ISO-8601, any other object as its
    str, and no control character left raw."""

    def encode(item: Any) -> Any:
        if isinstance(item, datetime):
            return item.isoformat()
        return str(item)

    # ASCII JSON escapes every control character but DEL; that one is escaped here.
    return json.dumps(value, default=encode, indent=2).replace("\x7f", "\\u007f")


def block(text: str) -> str:
    """A stored text whole, each of its lines escaped and indented: its line breaks
    are kept, and no line of it starts where the command's own lines do."""
    return "\n".join(f"    {printable(line)}" for line in text.rstrip().split("\n"))


def print_output(text: str) -> int:
    """Print a command's output; 141 (128 + SIGPIPE, as a shell tool ends) when the
    reader has gone (`jobs | head`), with nothing more written to the closed pipe."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that flush
        # does not fail (and print "Exception ignored") too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return 0
