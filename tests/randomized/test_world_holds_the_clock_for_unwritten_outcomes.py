"""The world moves its clock only while no outcome is left to write.

To a drain, a clock moved between a delivery's end and the write of its outcome is a
process frozen in between: its claim may run out, and the row goes out again. The world
plays that only as a fault (a jump); every other move waits for the outcomes.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from app.db import asyncpg_dsn
from app.testing import TestServer

from ..scheduler.conftest import eventually
from .plans import OutboxPlan, Scenario, Step
from .world import World, open_world

_ONE_WORKER = Scenario(
    jobs=(), outbox=OutboxPlan(batch_size=3, concurrency=2), supervisors=1, steps=()
)


async def _parked(world: World, key: str) -> bool:
    # A call counted and not busy is parked on the fake clock (calls and busy move
    # together, with no await between them).
    return world.receiver.calls[key] == 1 and not world.receiver.busy[key]


async def _settled(world: World) -> bool:
    return await world._in_flight() == []


async def _ended(world: World, key: str) -> bool:
    return key in world.receiver.ended


async def _in_flight_when_a_call_ends_during_the_read(url: str) -> list[str]:
    """What the world calls in flight when its read of the rows' claims began before a
    row was claimed, and that row's call ended (its outcome not written yet) before the
    read came back."""
    async with open_world(_ONE_WORKER, url, None) as world:
        # One delivery done: from now on the world reads the claims to judge outcomes.
        await world.play(Step("enqueue", advance=0.0, detail=("fast",)))
        await eventually(lambda: _settled(world), what="k0's delivery and its outcome")
        read = world._fetch
        holder: list[asyncpg.Connection] = []

        async def read_then_deliver(sql: str, **params: object) -> list[Any]:
            rows = await read(sql, **params)
            if holder or "claimed_by" not in sql:
                return rows
            # After the read: k1 is enqueued, claimed and delivered; its outcome write
            # waits on a lock this test holds on the row.
            await world._do_enqueue(Step("enqueue", advance=0.0, detail=("slow:5",)))
            await eventually(lambda: _parked(world, "k1"), what="k1's call parked")
            connection = await asyncpg.connect(asyncpg_dsn(url))
            holder.append(connection)
            await connection.execute("BEGIN")
            await connection.execute("SELECT 1 FROM outbox_messages WHERE key = 'k1' FOR UPDATE")
            world.advance(5.0)
            await eventually(lambda: _ended(world, "k1"), what="k1's call ended")
            return rows

        world._fetch = read_then_deliver  # type: ignore[method-assign]
        try:
            return await world._in_flight()
        finally:
            world._fetch = read  # type: ignore[method-assign]
            for connection in holder:
                await connection.close()


def test_an_outcome_left_to_write_holds_the_clock_even_when_its_call_ended_during_the_read(
    pg_server: TestServer,
) -> None:
    # Soak failure: "outbox key k0 delivered 2 times", the first delivery begun and
    # ended inside its lease (23:06:38.5, lease until 23:07:13.5), its pass alive; the
    # world moved the clock 41.5 s before the outcome was written, which then found its
    # claim run out (outbox.claim_lost) while the drain job delivered k0 again.
    url = pg_server.create_database()
    try:
        busy = asyncio.run(_in_flight_when_a_call_ends_during_the_read(url))
    finally:
        pg_server.release_database(url)
    assert busy == ["the outcome of k1 is not written yet"]
