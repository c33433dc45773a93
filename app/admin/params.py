"""Path parameters of the admin routes, shared by the API and the page.

A job id or outbox name outside these characters cannot exist (registration accepts
no other), so it is refused before any query; a message id is any int and the queries
answer 404 for one no bigint column can hold.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

__all__ = ["JOB_ID_PATTERN", "JobId", "MessageId", "OutboxName"]

JOB_ID_PATTERN = r"^[A-Za-z0-9_.:-]+$"

JobId = Annotated[str, Path(min_length=1, max_length=200, pattern=JOB_ID_PATTERN)]
OutboxName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_]+$")]
MessageId = Annotated[int, Path(ge=1)]
