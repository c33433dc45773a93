"""An app for the hung-leader test of fenced commits: the probe's 1 s job that records
(slot, pid), and a 1 s job that fences its transaction, writes (slot, pid) to
fenced_commits and works 0.8 s before it commits, as a job that moves money does
(ctx.fence just before the commit's work). The test creates both tables."""

import asyncio
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


@scheduler.job(every(seconds=1), id="fenced", name="Fenced commit")
async def fenced(ctx: JobContext) -> None:
    """Fence the transaction by this run's term, write (slot, pid), then work 0.8 s
    before committing; the test reads which commits landed."""
    async with ctx.session.begin():
        await ctx.fence(ctx.session)
        await ctx.session.execute(
            text("INSERT INTO fenced_commits (slot, pid) VALUES (:slot, :pid)"),
            {"slot": ctx.scheduled_at, "pid": os.getpid()},
        )
        await asyncio.sleep(0.8)


app = create_app(scheduler=scheduler)
