"""The outbox inside the app: its drain on the scheduler, NOTIFY wake-up, start-up check."""

import asyncio

import asyncpg
import pytest
from fastapi import FastAPI

from app.db import asyncpg_dsn
from app.main import create_app
from app.outbox import Outbox, OutboxNameTakenError, UnregisteredDrainError, sql
from app.scheduler import Role, Scheduler
from app.settings import Settings

from ..conftest import StartScheduler
from ..scheduler.conftest import eventually
from .conftest import FakeReceiver, MakeOutbox, SentStatements


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


async def test_a_woken_drain_claims_on_its_listen_connection_not_through_the_pool(
    database_url: str,
    start_scheduler: StartScheduler,
    make_outbox: MakeOutbox,
    receiver: FakeReceiver,
    sent_statements: SentStatements,
) -> None:
    # A pooled connection costs a checkout and its pre-ping (three round trips on
    # asyncpg) before the claim: the wake-up drains on the connection it listens on.
    scheduler = Scheduler()
    outbox = make_outbox("woken", scheduler=scheduler)
    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_for_role(Role.LEADER)
    enqueuer = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        async with enqueuer.transaction():
            await enqueuer.execute(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at)"
                " VALUES ('woken', 'k', '{\"amount\": 5}', 'pending', 0, $1, $1, $1)",
                outbox.clock.now(),
            )
            await enqueuer.execute("SELECT pg_notify($1, 'woken')", sql.NOTIFY_CHANNEL)
        await asyncio.wait_for(receiver.called.wait(), 10)

        async def delivered() -> bool:
            status = await enqueuer.fetchval("SELECT status FROM outbox_messages WHERE key = 'k'")
            return bool(status == "delivered")

        await eventually(delivered, what="the delivered outcome")
    finally:
        await enqueuer.close()
    assert [(m.key, m.payload) for m in receiver.calls] == [("k", {"amount": 5})]
    assert sent_statements.writing() == []


async def test_a_second_schedule_with_an_outbox_of_the_same_name_stops_its_start_up(
    settings: Settings, receiver: FakeReceiver
) -> None:
    first = Scheduler(name="alpha")
    first_sms = Outbox("sms", receiver, scheduler=first)
    first_app = create_app(settings, first)
    async with first_app.router.lifespan_context(first_app):
        second = Scheduler(name="beta")
        second_sms = Outbox("sms", receiver, scheduler=second)
        second_app = create_app(settings, second)
        with pytest.raises(OutboxNameTakenError, match=r"'sms'.*'alpha'") as refused:
            async with second_app.router.lifespan_context(second_app):
                pass
    assert (refused.value.name, refused.value.schedule) == ("sms", "alpha")
    assert second.supervisor is None
    del first_sms, second_sms


async def test_an_outbox_restarted_under_its_own_schedule_name_starts(
    settings: Settings, receiver: FakeReceiver
) -> None:
    for _ in range(2):
        scheduler = Scheduler(name="alpha")
        sms = Outbox("sms", receiver, scheduler=scheduler)
        app = create_app(settings, scheduler)
        async with app.router.lifespan_context(app):
            assert scheduler.supervisor is not None
        del sms
