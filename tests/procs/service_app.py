"""An app for the multi-process service tests: one leader-only service whose every copy
records when it began, then does its blocking work in ``asyncio.to_thread``: a thread
that waits while the test holds the gate (an advisory lock) and records when it passed."""

import asyncio
import os

import psycopg
from sqlalchemy import text

from app.main import create_app
from app.scheduler import Scheduler, ServiceContext

from .gated_app import GATE_KEY

SERVICE_COPIES_SQL = (
    "CREATE TABLE service_copies (id serial PRIMARY KEY, pid int NOT NULL,"
    " began_at timestamptz NOT NULL DEFAULT clock_timestamp(), thread_ended_at timestamptz)"
)

scheduler = Scheduler()


def _through_the_gate(copy: int) -> None:
    """The copy's blocking work: wait for the gate, record that this thread passed it."""
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock_shared(%s)", (GATE_KEY,))
        conn.execute("SELECT pg_advisory_unlock_shared(%s)", (GATE_KEY,))
        conn.execute(
            "UPDATE service_copies SET thread_ended_at = clock_timestamp() WHERE id = %s", (copy,)
        )


@scheduler.service(id="gated_consumer", name="Gated consumer")
async def gated_consumer(ctx: ServiceContext) -> None:
    """Record this copy, pass the gate in a thread, then idle until cancelled."""
    async with ctx.sessions() as session:
        inserted = await session.execute(
            text("INSERT INTO service_copies (pid) VALUES (:pid) RETURNING id"),
            {"pid": os.getpid()},
        )
        copy = int(inserted.scalar_one())
        await session.commit()
    await asyncio.to_thread(_through_the_gate, copy)
    await asyncio.Event().wait()


app = create_app(scheduler=scheduler)
