"""A message a job queues under run_job is stamped on the run's clock, so a test forces
its retry with drain(..., clock=FakeClock(later)), never by writing Regent's tables."""

from datetime import UTC, datetime, timedelta

from app.db import Database
from app.outbox import Message, Outbox
from app.scheduler import JobContext, Scheduler, every
from app.testing import FakeClock, RecordingReceiver, drain, run_job

AT = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def _fails_once() -> RecordingReceiver:
    calls = 0

    def behaviour(message: Message) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("receiver down")

    return RecordingReceiver(behaviour=behaviour)


async def test_a_failed_delivery_of_a_message_a_job_queued_is_retried_on_a_later_fake_clock(
    regent_database: Database,
) -> None:
    receiver = _fails_once()
    scheduler = Scheduler()
    mails = Outbox("kit_clock_mails", receiver, scheduler=scheduler)

    @scheduler.job(every(hours=1), id="queue_mail")
    async def queue_mail(ctx: JobContext) -> None:
        await mails.enqueue(ctx.session, {"to": "ada@example.com"}, key="mail-1")

    await run_job(scheduler, "queue_mail", database=regent_database, at=AT)
    failed = await drain(mails, database=regent_database)
    later = FakeClock(AT + timedelta(minutes=1))
    retried = await drain(mails, database=regent_database, clock=later)

    assert (failed.retried, retried.delivered) == (1, 1)
    assert receiver.delivered == {"mail-1": 1}
