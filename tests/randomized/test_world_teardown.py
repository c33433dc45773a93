"""A randomized world closes what it opened only once its workers are done with it."""

from __future__ import annotations

import asyncio

from app.testing import TestServer

from .plans import JobPlan, OutboxPlan, Scenario, Step
from .world import open_world

# A thread job whose body outlasts the step that stops its only worker: the body runs
# on in its thread, and its outcome is written after that worker's stop returned.
_OUTLIVES_ITS_WORKER = Scenario(
    jobs=(
        JobPlan(
            id="job0",
            interval=10,
            expression=None,
            tz=None,
            thread=True,
            duration=45.0,
            jitter=0.0,
            misfire_grace=None,
            first_run=None,
        ),
    ),
    outbox=OutboxPlan(batch_size=3, concurrency=2),
    supervisors=1,
    steps=(Step(action="stop", advance=61.0),),
)


async def _bodies_running_at_dispose(scenario: Scenario, url: str) -> list[set[str]]:
    """Play the scenario and close the world; the jobs each worker still ran (or still
    recorded) when the world disposed of its database."""
    seen: list[set[str]] = []
    async with open_world(scenario, url, None) as world:
        for step in scenario.steps:
            await world.play(step)
        dispose = world.db.dispose

        async def dispose_and_look() -> None:
            for node in world.nodes:
                assert node.scheduler.supervisor is not None
                seen.append(node.scheduler.supervisor.running_job_ids)
            await dispose()

        world.db.dispose = dispose_and_look  # type: ignore[method-assign]
    return seen


def test_a_world_disposes_its_database_only_after_a_body_that_outlived_its_worker(
    pg_server: TestServer,
) -> None:
    # A pool connection checked out across dispose() goes back to the disposed pool,
    # which nothing closes: asyncpg warns "unclosed connection" when it is collected.
    url = pg_server.create_database()
    try:
        seen = asyncio.run(_bodies_running_at_dispose(_OUTLIVES_ITS_WORKER, url))
    finally:
        pg_server.release_database(url)
    assert seen == [set()]
