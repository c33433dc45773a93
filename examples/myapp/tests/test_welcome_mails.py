"""Each signup gets one welcome mail, however often the job runs."""

from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from myapp.jobs import build
from regent import Database
from regent.testing import FakeClock, RecordingReceiver, drain, run_job

AT = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


async def _signups(database: Database, *emails: str) -> None:
    # The table comes from migrations/: each test's database holds them.
    async with database.engine.begin() as conn:
        for email in emails:
            await conn.execute(text("INSERT INTO signups (email) VALUES (:e)"), {"e": email})


async def test_each_signup_gets_one_welcome_mail_when_the_job_runs_twice(
    regent_database: Database,
) -> None:
    await _signups(regent_database, "ada@example.com", "alan@example.com")
    receiver = RecordingReceiver()
    scheduler, mails = build(receiver)
    first = await run_job(scheduler, "queue_welcome_mails", database=regent_database, at=AT)
    again = await run_job(
        scheduler, "queue_welcome_mails", database=regent_database, at=AT + timedelta(minutes=5)
    )
    report = await drain(mails, database=regent_database)
    assert (first.status, again.status) == ("ok", "ok")
    assert report.delivered == 2
    assert receiver.delivered == {"welcome-1": 1, "welcome-2": 1}


async def test_a_failed_delivery_is_retried_by_a_later_drain(regent_database: Database) -> None:
    await _signups(regent_database, "grace@example.com")
    calls = 0

    def flaky(message: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("mail provider down")

    receiver = RecordingReceiver(behaviour=flaky)
    scheduler, mails = build(receiver)
    await run_job(scheduler, "queue_welcome_mails", database=regent_database, at=AT)
    assert (await drain(mails, database=regent_database)).retried == 1
    # The job ran at AT, so its mail's retry is due a few seconds after it.
    later = FakeClock(AT + timedelta(minutes=1))
    assert (await drain(mails, database=regent_database, clock=later)).delivered == 1
    assert receiver.delivered == {"welcome-1": 1}
