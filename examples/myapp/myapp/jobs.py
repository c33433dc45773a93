"""Welcome mails: a job queues one per new signup; an outbox delivers them."""

from __future__ import annotations

import logging

from sqlalchemy import text

from regent import Deliver, JobContext, Message, Outbox, Scheduler, every

logger = logging.getLogger("myapp")

# The signups table is the app's own (migrations/versions/*_signups.py); the job stamps
# each row it has queued a mail for.
_UNWELCOMED = text(
    "SELECT id, email FROM signups WHERE welcomed_at IS NULL ORDER BY id"
    " FOR UPDATE SKIP LOCKED LIMIT 500"
)
_STAMP = text("UPDATE signups SET welcomed_at = :now WHERE id = :id")


async def send_welcome_mail(message: Message) -> None:
    """Stands in for a mail provider; the idempotency key is ``message.key``."""
    logger.info("welcome mail to %s (key %s)", message.payload["to"], message.key)


def build(deliver: Deliver = send_welcome_mail) -> tuple[Scheduler, Outbox]:
    """The app's scheduler, with the welcome job and the outbox's drain on it."""
    scheduler = Scheduler()
    mails = Outbox("welcome_mails", deliver, scheduler=scheduler)

    @scheduler.job(every(minutes=5), id="queue_welcome_mails", name="Queue welcome mails")
    async def queue_welcome_mails(ctx: JobContext) -> None:
        # One transaction: the outbox row and the stamp commit together when the job
        # returns, so a second run (or a second process) queues nothing twice.
        rows = (await ctx.session.execute(_UNWELCOMED)).all()
        for signup_id, email in rows:
            await mails.enqueue(ctx.session, {"to": email}, key=f"welcome-{signup_id}")
            await ctx.session.execute(_STAMP, {"id": signup_id, "now": ctx.clock.now()})
        ctx.log.info("queued %s welcome mail(s)", len(rows))

    return scheduler, mails
