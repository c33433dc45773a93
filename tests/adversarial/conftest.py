"""Fixtures of the adversarial tests: the scheduler tests' blocking bodies."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ..scheduler.conftest import BlockingBodies


@pytest.fixture
def bodies() -> Iterator[BlockingBodies]:
    """Blocking sync bodies; released at teardown so no thread outlives the test."""
    blocking = BlockingBodies()
    yield blocking
    blocking.release.set()
