"""An app for the multi-process fault tests: one 1 s job that records (slot, pid), and
one that records the same only when a run of it is requested."""

import os

from sqlalchemy import text

from app.main import create_app
from app.scheduler import JobContext, Scheduler, every

scheduler = Scheduler()


async def _record(ctx: JobContext) -> None:
    async with ctx.session.begin():
        await ctx.session.execute(
            text("INSERT INTO probe_fires (slot, pid) VALUES (:slot, :pid)"),
            {"slot": ctx.scheduled_at, "pid": os.getpid()},
        )


@scheduler.job(every(seconds=1), id="probe", name="Record probe slot")
async def probe(ctx: JobContext) -> None:
    """Write the slot and this process's pid; the test reads who fired what."""
    await _record(ctx)


@scheduler.job(every(days=365), id="on_request", name="Record a requested run")
async def on_request(ctx: JobContext) -> None:
    """Never due on its own: a run of it is always a request (bench/failover.py), and a
    request of it never waits for a claim of the probe's slots to commit."""
    await _record(ctx)


app = create_app(scheduler=scheduler)
