"""Random job sets, receivers, faults and operator actions against the real supervisor,
runner and outbox; every guarantee is checked after every step.

The CI profile is derandomized (a fixed seed) and bounded; the soak profile runs many
more and longer scenarios, with server restarts, and shrinks a failure to a minimal
step sequence: ``python -m pytest -m soak``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings

from ..pgserver import TestServer
from .plans import Scenario, scenarios
from .world import open_world

_COMMON = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


def _play(pg_server: TestServer, scenario: Scenario) -> None:
    url = pg_server.create_database()
    try:
        asyncio.run(_run(scenario, url, pg_server if pg_server.can_restart else None))
    finally:
        pg_server.drop_database(url)


async def _run(
    scenario: Scenario, url: str, server: TestServer | None, say: Callable[[str], None] = note
) -> None:
    async with open_world(scenario, url, server) as world:
        for index, step in enumerate(scenario.steps):
            say(f"step {index}: {step}")
            await world.play(step)
        await world.finish()
        logging.getLogger("tests.randomized").info(
            "scenario done: %s steps, %s faults, %s keys",
            world.steps,
            world.faults,
            len(world.keys),
        )


@settings(
    max_examples=6,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    **_COMMON,  # type: ignore[arg-type]
)
@given(scenario=scenarios(min_steps=8, max_steps=14, restarts=False))
def test_guarantees_hold_under_random_faults(pg_server: TestServer, scenario: Scenario) -> None:
    """No slot runs twice, no key is delivered twice, nothing is lost or stuck, one
    worker fires and one runs the services: after every step of random scenarios."""
    _play(pg_server, scenario)


@pytest.mark.soak
@settings(max_examples=60, **_COMMON)  # type: ignore[arg-type]
@given(scenario=scenarios(min_steps=1, max_steps=40, restarts=True))
def test_guarantees_hold_through_a_long_soak(pg_server: TestServer, scenario: Scenario) -> None:
    """The same guarantees over many longer scenarios, server restarts included."""
    _play(pg_server, scenario)
