"""The outbox inside the app: its drain on the scheduler, NOTIFY wake-up, start-up check."""

import asyncio

import pytest
from fastapi import FastAPI

from app.main import create_app
from app.outbox import Outbox, UnregisteredDrainError
from app.scheduler import Role, Scheduler
from app.settings import Settings

from .conftest import FakeReceiver


async def test_outbox_registers_its_drain_job_by_convention(receiver: FakeReceiver) -> None:
    scheduler = Scheduler()
    Outbox("key_syncs", receiver, scheduler=scheduler)
    drain = scheduler.jobs["outbox_key_syncs_drain"]
    assert drain.name == "Deliver queued key_syncs"
    assert drain.trigger.describe() == "every 60s"
    assert "outbox_key_syncs_wakeup" in scheduler.services


async def test_outbox_without_a_drain_on_the_app_scheduler_stops_start_up(
    settings: Settings, receiver: FakeReceiver
) -> None:
    orphan = Outbox("sparks_grants", receiver)
    app = create_app(settings, Scheduler())
    with pytest.raises(UnregisteredDrainError, match="'sparks_grants' has no drain"):
        async with app.router.lifespan_context(app):
            pass
    del orphan


async def test_enqueue_commit_wakes_the_leaders_drain(
    settings: Settings, receiver: FakeReceiver
) -> None:
    scheduler = Scheduler()
    outbox = Outbox("wakeups", receiver, scheduler=scheduler)
    app: FastAPI = create_app(settings, scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.LEADER)
        async with app.state.database.sessions() as session, session.begin():
            await outbox.enqueue(session, {"amount": 5}, key="now")
        # The drain job's own tick is a minute away: only the NOTIFY can deliver this.
        await asyncio.wait_for(receiver.called.wait(), 10)
    assert [message.key for message in receiver.calls] == ["now"]
