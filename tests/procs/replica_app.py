"""An app for the per-worker run tests: one 1 s per-worker (leader_only=False) thread
job whose body blocks while the test holds the gate (an advisory lock), and records
which worker ran it."""

import os

from sqlalchemy import text

from app.main import create_app
from app.scheduler import JobContext, Scheduler, every

from .gated_app import GATE_KEY

REPLICA_BODIES_SQL = (
    "CREATE TABLE replica_bodies (slot timestamptz NOT NULL, pid int NOT NULL,"
    " started_at timestamptz NOT NULL DEFAULT clock_timestamp(), ended_at timestamptz)"
)

scheduler = Scheduler()


@scheduler.job(every(seconds=1), id="sweep", name="Gated per-worker sweep", leader_only=False)
def sweep(ctx: JobContext) -> None:
    """Record the start, wait for the gate, record the end."""
    session = ctx.sync_session
    params = {"slot": ctx.scheduled_at, "pid": os.getpid()}
    session.execute(text("INSERT INTO replica_bodies (slot, pid) VALUES (:slot, :pid)"), params)
    session.commit()
    session.execute(text("SELECT pg_advisory_lock_shared(:key)"), {"key": GATE_KEY})
    session.execute(text("SELECT pg_advisory_unlock_shared(:key)"), {"key": GATE_KEY})
    session.execute(
        text(
            "UPDATE replica_bodies SET ended_at = clock_timestamp() WHERE slot = :slot"
            " AND pid = :pid"
        ),
        params,
    )
    session.commit()


app = create_app(scheduler=scheduler)
