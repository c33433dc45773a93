"""Path parameters of the admin routes, shared by the API and the page.

A job id or outbox name outside these characters cannot exist (registration accepts
no other), so it is refused before any query; a message id is any int and the queries
answer 404 for one no bigint column can hold.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

from fastapi import Path

__all__ = ["JOB_ID_PATTERN", "JobId", "MessageId", "OutboxName", "path_segment"]

JOB_ID_PATTERN = r"^[A-Za-z0-9_.:-]+$"

JobId = Annotated[str, Path(min_length=1, max_length=200, pattern=JOB_ID_PATTERN)]
OutboxName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_]+$")]
MessageId = Annotated[int, Path(ge=1)]


def path_segment(value: object) -> str:
    """``value`` as one segment of a URL's path: percent-encoded with nothing kept
    ("/", "?", "#", "%" and the rest encoded), and a segment of only dots ("." or "..",
    which a URL's resolution would take for "this" or "the parent") with its dots
    encoded. Every segment the admin page builds from data goes through it, so no value
    sends a link or a form to another route. (A browser still takes "%2E%2E" for ".."
    (WHATWG URL): such a value's buttons answer 404 or 405, reaching no other action.)"""
    segment = quote(str(value), safe="")
    return segment.replace(".", "%2E") if segment in (".", "..") else segment
