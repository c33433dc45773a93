"""A leader-only long-poll consumer: one getUpdates consumer per source, ever.

Runs as ``@scheduler.service``: only the leader consumes, and demotion cancels it. Each
update's effect and the advanced offset commit together, and processed_updates has the
update id as its key, so after a failover the new leader resumes from the stored offset
and no update is processed twice.
"""

from __future__ import annotations

import os
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.scheduler import Clock, Scheduler, ServiceContext

from .gateways import Update, UpdatesSource

__all__ = ["POLL_TIMEOUT_SECONDS", "SOURCE", "consume_once", "register"]

SOURCE = "updates"
POLL_TIMEOUT_SECONDS = 25.0

_OFFSET = text("SELECT next_offset FROM update_offsets WHERE source = :source")
_PROCESS = text(
    """
    INSERT INTO processed_updates (source, update_id, text, processed_by_pid, processed_at)
    VALUES (:source, :update_id, :text, :pid, :now)
    ON CONFLICT DO NOTHING
    """
)
_ADVANCE = text(
    """
    INSERT INTO update_offsets (source, next_offset) VALUES (:source, :next_offset)
    ON CONFLICT (source) DO UPDATE SET next_offset = excluded.next_offset
    WHERE update_offsets.next_offset < excluded.next_offset
    """
)


async def consume_once(
    session: AsyncSession, source: UpdatesSource, clock: Clock, timeout: float
) -> list[Update]:
    """One long poll from the stored offset; process and commit each update with the
    offset past it. Returns the updates processed."""
    async with session.begin():
        offset = (await session.execute(_OFFSET, {"source": SOURCE})).scalar() or 0
    updates = [u for u in await source.get_updates(offset, timeout) if u.update_id >= offset]
    for update in updates:
        await _process(session, update, clock.now())
    return updates


async def _process(session: AsyncSession, update: Update, now: datetime) -> None:
    async with session.begin():
        await session.execute(
            _PROCESS,
            {
                "source": SOURCE,
                "update_id": update.update_id,
                "text": update.text,
                "pid": os.getpid(),
                "now": now,
            },
        )
        await session.execute(_ADVANCE, {"source": SOURCE, "next_offset": update.update_id + 1})


def register(scheduler: Scheduler, source: UpdatesSource) -> None:
    """The leader-only service "Consume bot updates"."""

    @scheduler.service(id="updates_consumer", name="Consume bot updates")
    async def updates_consumer(ctx: ServiceContext) -> None:
        async with ctx.sessions() as session:
            while True:
                await consume_once(session, source, ctx.clock, POLL_TIMEOUT_SECONDS)
