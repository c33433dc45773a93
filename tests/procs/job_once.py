"""Run one of the app's money or message jobs once, in its own process.

    python -m tests.procs.job_once JOB DATABASE_URL

The outside systems are fakes that write to tables (``sms_outbox_fake``,
``psp_fake``) with no unique constraint, so a second send or charge shows as a second
row. The test starts several of these at once.
"""

import asyncio
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import text

from app.db import Database
from app.jobs.booking_reminders import send_due_reminders
from app.jobs.gateways import ChargeResult
from app.jobs.subscriptions import charge_due_subscriptions

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class TableSms:
    def __init__(self, database: Database) -> None:
        self.database = database

    async def send(self, phone: str, body: str) -> None:
        async with self.database.engine.begin() as conn:
            await conn.execute(text("INSERT INTO sms_fake (phone) VALUES (:p)"), {"p": phone})


class TablePsp:
    def __init__(self, database: Database) -> None:
        self.database = database

    async def charge(self, reference: str, amount_cents: int) -> ChargeResult:
        async with self.database.engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO psp_fake (reference, amount) VALUES (:r, :a)"),
                {"r": reference, "a": amount_cents},
            )
        return ChargeResult("succeeded", reference[:8])

    async def lookup(self, reference: str) -> ChargeResult:
        return ChargeResult("unknown")


async def main(job: str, url: str) -> None:
    database = Database.from_url(url)
    try:
        async with database.sessions() as session:
            if job == "reminders":
                await send_due_reminders(session, TableSms(database), NOW)
            else:
                await charge_due_subscriptions(
                    session, TablePsp(database), NOW, timedelta(minutes=15)
                )
    finally:
        await database.dispose()


def run(argv: Sequence[str]) -> None:
    asyncio.run(main(argv[1], argv[2]))


if __name__ == "__main__":
    run(sys.argv)
