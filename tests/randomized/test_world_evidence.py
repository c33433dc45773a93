"""A broken guarantee is reported with the evidence to find its cause from the report
alone: a soak failure is seen once, and its run's output may be all there is."""

from __future__ import annotations

import asyncio

import pytest

from app.testing import TestServer

from .plans import JobPlan, OutboxPlan, Scenario, Step
from .world import open_world

_ONE_JOB_TWO_STEPS = Scenario(
    jobs=(
        JobPlan(
            id="job0",
            interval=10,
            expression=None,
            tz=None,
            thread=False,
            duration=0.0,
            jitter=0.0,
            misfire_grace=None,
            first_run=None,
        ),
    ),
    outbox=OutboxPlan(batch_size=3, concurrency=2),
    supervisors=1,
    steps=(
        Step(action="tick", advance=11.0),
        Step(action="enqueue", advance=1.0, detail=("fast",)),
    ),
)


async def _play_and_break(url: str) -> None:
    async with open_world(_ONE_JOB_TWO_STEPS, url, None) as world:
        for step in _ONE_JOB_TWO_STEPS.steps:
            await world.play(step)
        world.recorder.violation("a guarantee the test breaks")
        await world.check()


def test_a_broken_guarantee_is_reported_with_the_steps_the_rows_and_the_log(
    pg_server: TestServer,
) -> None:
    url = pg_server.create_database()
    try:
        with pytest.raises(AssertionError, match="a guarantee the test breaks") as raised:
            asyncio.run(_play_and_break(url))
    finally:
        pg_server.release_database(url)
    evidence = "\n".join(getattr(raised.value, "__notes__", []))
    assert "after 2 step(s) of 2" in evidence
    assert "nodes: node0: leader" in evidence
    assert "scheduler_jobs:\n  id='job0'" in evidence
    assert "job_id='job0'" in evidence  # its runs
    assert "key='k0'" in evidence  # the outbox row
    assert "soak.step 1: Step(action='enqueue'" in evidence  # the log's tail
    assert "scheduler.promoted" in evidence
