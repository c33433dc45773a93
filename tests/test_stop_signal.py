"""A worker told to stop (SIGTERM, SIGINT) stops its scheduler at once, not when the
server gets round to the lifespan's shutdown, and the server still gets the signal."""

import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from app.main import create_app
from app.scheduler import Role, Scheduler
from app.settings import Settings


@pytest.fixture
def server_handler() -> Iterator[list[int]]:
    """Stands in for uvicorn's SIGTERM handler: records the signals it is handed."""
    received: list[int] = []

    def handle_exit(sig: int, frame: FrameType | None) -> None:
        received.append(sig)

    before = signal.signal(signal.SIGTERM, handle_exit)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, before)


async def test_sigterm_stops_the_scheduler_before_the_lifespan_shutdown(
    settings: Settings, server_handler: list[int]
) -> None:
    scheduler = Scheduler()
    app = create_app(settings, scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.LEADER)
        signal.raise_signal(signal.SIGTERM)
        await scheduler.supervisor.wait_for_role(Role.STOPPED, timeout=5)
        assert server_handler == [signal.SIGTERM]


async def test_the_servers_handler_is_back_after_the_lifespan(
    settings: Settings, server_handler: list[int]
) -> None:
    before = signal.getsignal(signal.SIGTERM)
    app = create_app(settings, Scheduler())
    async with app.router.lifespan_context(app):
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before
