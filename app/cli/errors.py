"""What an operator command refuses or reports as a failure; `python -m app` prints the
message and exits non-zero (UsageError 2, RunNotOkError 1)."""

from __future__ import annotations

__all__ = ["RunNotOkError", "UsageError"]


class UsageError(Exception):
    """A command was given without the sub-command it needs; the message is its usage."""


class RunNotOkError(Exception):
    """`jobs run --wait`: the run ended other than ok, or did not end in time. The
    message is what to print (the run, as the command prints it)."""
