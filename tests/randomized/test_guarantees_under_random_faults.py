"""Random job sets, receivers, faults and operator actions against the real supervisor,
runner and outbox; every guarantee is checked after every step.

The CI profile is derandomized (a fixed seed) and bounded; the soak profile runs many
more and longer scenarios with a fresh seed each time, server restarts included:
``python -m pytest -m soak`` (add ``--hypothesis-show-statistics`` for the steps, faults
and outbox keys each scenario ran). A failure names the scenario and every step played,
and its traceback carries what the world held when it broke (World.evidence): the rows,
the nodes, the log's last records. Keep the run's output: a soak failure may not come
again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, event, given, note, settings

from app.testing import TestServer

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
        steps, faults, keys = asyncio.run(
            _run(scenario, url, pg_server if pg_server.can_restart else None)
        )
    finally:
        pg_server.release_database(url)
    # Shown by `--hypothesis-show-statistics`: how much each scenario exercised.
    event("steps", payload=steps)
    event("faults", payload=faults)
    event("outbox keys", payload=keys)


async def _run(
    scenario: Scenario, url: str, server: TestServer | None, say: Callable[[str], None] = note
) -> tuple[int, int, int]:
    """Play the scenario, checking after every step; return (steps, faults, keys)."""
    async with open_world(scenario, url, server) as world:
        for index, step in enumerate(scenario.steps):
            say(f"step {index}: {step}")
            await world.play(step)
        await world.finish()
        return world.steps, world.faults, len(world.keys)


@settings(
    max_examples=10,
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],
    **_COMMON,  # type: ignore[arg-type]
)
@given(scenario=scenarios(min_steps=6, max_steps=12, restarts=False))
def test_guarantees_hold_under_random_faults(pg_server: TestServer, scenario: Scenario) -> None:
    """No slot runs twice, no key is delivered twice, nothing is lost or stuck, one
    worker fires and one runs the services: after every step of random scenarios."""
    _play(pg_server, scenario)


@pytest.mark.soak
@settings(
    max_examples=60,
    # Races make a replay inexact, so shrinking would end in "flaky" rather than in a
    # smaller case: the first failing scenario is reported as played, step by step.
    phases=[Phase.explicit, Phase.generate],
    # The failing scenario's draw, to replay it with @reproduce_failure (as exactly as
    # its races allow; the failure's own note, World.evidence, says what broke).
    print_blob=True,
    **_COMMON,  # type: ignore[arg-type]
)
@given(scenario=scenarios(min_steps=1, max_steps=40, restarts=True))
def test_guarantees_hold_through_a_long_soak(pg_server: TestServer, scenario: Scenario) -> None:
    """The same guarantees over many longer scenarios, server restarts included."""
    _play(pg_server, scenario)
