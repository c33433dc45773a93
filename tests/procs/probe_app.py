"""An app for the multi-process fault tests: one 1 s job that records (slot, pid)."""

import os

from sqlalchemy import text

from app.main import create_app
from app.scheduler import JobContext, Scheduler, every

scheduler = Scheduler()


@scheduler.job(every(seconds=1), id="probe", name="Record probe slot")
async def probe(ctx: JobContext) -> None:
    """Write the slot and this process's pid; the test reads who fired what."""
    async with ctx.session.begin():
        await ctx.session.execute(
            text("INSERT INTO probe_fires (slot, pid) VALUES (:slot, :pid)"),
            {"slot": ctx.scheduled_at, "pid": os.getpid()},
        )


app = create_app(scheduler=scheduler)
