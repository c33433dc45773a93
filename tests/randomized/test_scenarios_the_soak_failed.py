"""Scenarios the soak once failed, played step by step as the soak plays them: each
stays a test of its own once its cause is fixed."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from app.testing import TestServer

from ..scheduler.conftest import eventually, prepared_claim_waits
from .plans import JobPlan, OutboxPlan, Scenario, Step
from .world import open_world

# A job whose body outlasts a step: it still holds its running lease when the world
# next checks that every lease it renews outlasts a tick.
_ONE_LONG_BODY = Scenario(
    jobs=(
        JobPlan(
            id="job0",
            interval=10,
            expression=None,
            tz=None,
            thread=False,
            duration=45.0,
            jitter=0.0,
            misfire_grace=None,
            first_run=None,
        ),
    ),
    outbox=OutboxPlan(batch_size=3, concurrency=2),
    supervisors=1,
    steps=(),
)


async def _jump_while_a_claim_waits_for_its_slot(url: str) -> None:
    async with open_world(_ONE_LONG_BODY, url, None) as world:
        async with world.db.engine.connect() as conn:
            slot = (
                await conn.execute(text("SELECT next_run_at FROM scheduler_jobs WHERE id = 'job0'"))
            ).scalar_one()
        # Into the claim lead (0.5 s): the leader prepares the slot's claim and waits.
        await world.play(Step("tick", advance=(slot - world.clock.now()).total_seconds() - 0.5))
        await eventually(lambda: prepared_claim_waits(world.db.engine), what="a prepared claim")
        # The slot comes, and before the claim commits everything freezes for an hour.
        await world.play(Step("jump", advance=0.5, detail=("3600",)))
        await world.play(Step("tick", advance=1.0))
        await world.finish()


def test_a_claim_that_commits_after_a_jump_starts_a_body_whose_lease_is_renewed_in_time(
    pg_server: TestServer,
) -> None:
    # Soak failure (claim lead 0.5 s): "stuck after 0 tick(s) at 00:00:11: ['job0 (run 1)
    # leased until 23:05:11']": the claim took its lease as of its slot, an hour before
    # its commit, and the body's first renewal is due a third of a lease after it began.
    url = pg_server.create_database()
    try:
        asyncio.run(_jump_while_a_claim_waits_for_its_slot(url))
    finally:
        pg_server.release_database(url)
