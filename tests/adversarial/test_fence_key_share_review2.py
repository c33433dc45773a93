"""ctx.fence takes the term row FOR KEY SHARE; a promotion locks it FOR UPDATE before its
bump (cold review of item 4). A fenced commit of an old leadership must never land after
a new leadership began, whatever the job's isolation level and whatever heartbeats
wrote the row meanwhile."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db import Database
from app.scheduler import FakeClock, JobContext
from app.scheduler.errors import LeadershipLostError

from ..conftest import promote_elsewhere

T0 = datetime(2026, 1, 1, tzinfo=UTC)
_HEARTBEAT = text("UPDATE scheduler_leadership SET heartbeat_at = clock_timestamp()")


def _ctx(term: int) -> JobContext:
    return JobContext(
        job_id="money",
        name="money",
        scheduled_at=T0,
        clock=FakeClock(T0),
        log=logging.LoggerAdapter(logging.getLogger("test")),
        term=term,
    )


async def _repeatable_read(database: Database) -> AsyncSession:
    session = database.sessions()
    await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    # The transaction's snapshot: the body read something before it fenced.
    await session.execute(text("SELECT 1"))
    return session


async def test_a_repeatable_read_body_cannot_pass_the_fence_after_a_new_promotion(
    database: Database, database_url: str
) -> None:
    term = await promote_elsewhere(database_url)
    session = await _repeatable_read(database)
    try:
        await promote_elsewhere(database_url)
        with pytest.raises((LeadershipLostError, DBAPIError)):
            await _ctx(term).fence(session)
    finally:
        await session.close()


async def test_a_repeatable_read_body_passes_the_fence_when_only_heartbeats_wrote_the_row(
    database: Database, database_url: str, engine: AsyncEngine
) -> None:
    """The leader's tick rewrites the term row every tick (its heartbeat). A fenced job
    transaction under repeatable read whose snapshot predates a heartbeat is still of the
    current leadership: its fence passes (FOR SHARE failed it to serialize)."""
    term = await promote_elsewhere(database_url)
    session = await _repeatable_read(database)
    try:
        async with engine.begin() as conn:
            await conn.execute(_HEARTBEAT)
        await _ctx(term).fence(session)
        await session.commit()
    finally:
        await session.close()


async def test_a_repeatable_read_body_cannot_pass_the_fence_after_a_heartbeat_and_a_promotion(
    database: Database, database_url: str, engine: AsyncEngine
) -> None:
    """The snapshot's version of the row was replaced by a heartbeat (a non-key update),
    and the heartbeat's version by the promotion's bump."""
    term = await promote_elsewhere(database_url)
    session = await _repeatable_read(database)
    try:
        async with engine.begin() as conn:
            await conn.execute(_HEARTBEAT)
        await promote_elsewhere(database_url)
        with pytest.raises((LeadershipLostError, DBAPIError)):
            await _ctx(term).fence(session)
    finally:
        await session.close()


async def test_a_fence_taken_beside_a_heartbeat_under_way_still_holds_off_the_promotion(
    database: Database, database_url: str, engine: AsyncEngine
) -> None:
    term = await promote_elsewhere(database_url)
    async with engine.connect() as beat:
        await beat.execute(_HEARTBEAT)  # open: the heartbeat is under way
        session = database.sessions()
        try:
            await asyncio.wait_for(_ctx(term).fence(session), 5)
            await beat.commit()
            async with engine.begin() as conn:
                await conn.execute(_HEARTBEAT)
            promotion = asyncio.ensure_future(promote_elsewhere(database_url))
            done, _ = await asyncio.wait({promotion}, timeout=2)
            assert not done, "the promotion did not wait for the fenced transaction"
            await session.commit()
            assert await asyncio.wait_for(promotion, 5) == term + 1
        finally:
            await session.close()


async def test_a_fence_taken_while_the_promotion_waits_cannot_commit_after_it(
    database: Database, database_url: str
) -> None:
    """The promotion waits for a first fenced transaction; a second fence arrives while
    it waits (KEY SHARE beside KEY SHARE does not queue behind the FOR UPDATE)."""
    term = await promote_elsewhere(database_url)
    first, second = database.sessions(), database.sessions()
    try:
        await _ctx(term).fence(first)
        promotion = asyncio.ensure_future(promote_elsewhere(database_url))
        done, _ = await asyncio.wait({promotion}, timeout=1)
        assert not done
        try:
            await asyncio.wait_for(_ctx(term).fence(second), 2)
        except (LeadershipLostError, TimeoutError):
            second_passed = False
        else:
            second_passed = True
        await first.commit()
        if second_passed:
            done, _ = await asyncio.wait({promotion}, timeout=2)
            assert not done, "the promotion ended while a fenced transaction was open"
            await second.commit()
        assert await asyncio.wait_for(promotion, 10) == term + 1
    finally:
        await first.close()
        await second.close()


async def test_a_promotion_under_a_repeatable_read_default_survives_a_heartbeat_while_it_waits(
    database: Database, database_url: str, engine: AsyncEngine
) -> None:
    """Under ``default_transaction_isolation = 'repeatable read'`` (a setup the scheduler
    supports) the promotion's record waits for a fenced transaction; meanwhile the old
    leader's tick beats (its UPDATE no longer waits for the fence). When the fenced
    transaction ends, the promotion must still begin its term."""
    term = await promote_elsewhere(database_url)
    async with engine.connect() as conn:
        name = (await conn.execute(text("SELECT current_database()"))).scalar_one()
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(
            text(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'")
        )
    await engine.dispose()
    session = database.sessions()
    try:
        await _ctx(term).fence(session)
        promotion = asyncio.ensure_future(promote_elsewhere(database_url))
        done, _ = await asyncio.wait({promotion}, timeout=1)
        assert not done, "the promotion did not wait for the fenced transaction"
        # The old leader's heartbeat, as its tick writes it, lands beside the waiting bump.
        async with engine.begin() as conn:
            await asyncio.wait_for(conn.execute(_HEARTBEAT), 5)
        await session.commit()
        assert await asyncio.wait_for(promotion, 5) == term + 1
    finally:
        await session.close()
