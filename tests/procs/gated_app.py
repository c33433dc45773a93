"""An app for the multi-process overlap test: one 1 s sync job whose body blocks in its
thread while the test holds the gate (an advisory lock), and records when it ran."""

import os

from sqlalchemy import text

from app.main import create_app
from app.scheduler import JobContext, Scheduler, every

GATE_KEY = 911000077

GATED_TABLE_SQL = (
    "CREATE TABLE gated_bodies (slot timestamptz NOT NULL, pid int NOT NULL,"
    " started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)"
)

scheduler = Scheduler()


@scheduler.job(every(seconds=1), id="gated", name="Gated thread body")
def gated(ctx: JobContext) -> None:
    """Record the start, wait for the gate, record the end."""
    session = ctx.sync_session
    params = {"slot": ctx.scheduled_at, "pid": os.getpid()}
    session.execute(text("INSERT INTO gated_bodies (slot, pid) VALUES (:slot, :pid)"), params)
    session.commit()
    session.execute(text("SELECT pg_advisory_lock_shared(:key)"), {"key": GATE_KEY})
    session.execute(text("SELECT pg_advisory_unlock_shared(:key)"), {"key": GATE_KEY})
    session.execute(
        text("UPDATE gated_bodies SET ended_at = clock_timestamp() WHERE slot = :slot"), params
    )
    session.commit()


app = create_app(scheduler=scheduler)
