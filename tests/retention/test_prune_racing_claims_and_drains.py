"""A prune racing the leader's claims and an outbox's drain touches nothing live: a
running run keeps its row (and so records its outcome), a job's newest run stays, every
message is delivered once, and stuck rows stay."""

from __future__ import annotations

import asyncio
import collections

from sqlalchemy import text

from app.db import Database, asyncpg_dsn
from app.outbox import Message, Outbox, PermanentDeliveryError
from app.retention import RetentionPolicy, prune
from app.scheduler import JobContext, RunFinished, Scheduler, SystemClock, every

from ..conftest import StartScheduler

# The most a prune can take: every finished run but each job's newest, every
# delivered row at once; in batches of 5, so that it runs many short statements.
EAGER = RetentionPolicy(
    run_history_days=0, run_history_keep=1, outbox_delivered_days=0, batch_size=5
)
KEYS = [f"k{n}" for n in range(60)]
REFUSED = {"k7", "k23", "k41"}

_LEASE_WITHOUT_ITS_RUN = text(
    """
    SELECT count(*) FROM scheduler_jobs j
    WHERE j.running_until IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM scheduler_runs r WHERE r.id = j.running_run_id)
    """
)
_NEWEST_RUN = text("SELECT max(id) FROM scheduler_runs WHERE job_id = 'ticker'")
_STUCK_KEYS = text("SELECT key FROM outbox_messages WHERE status = 'stuck'")
_BROKEN = text("SELECT count(*) FROM scheduler_broken_jobs")


def statuses_ok(outcomes: list[RunFinished]) -> int:
    """How many runs ended ok."""
    return sum(event.status == "ok" for event in outcomes)


async def test_a_prune_racing_claims_and_a_drain_touches_nothing_live(
    database: Database, database_url: str, start_scheduler: StartScheduler
) -> None:
    delivered: collections.Counter[str] = collections.Counter()

    async def deliver(message: Message) -> None:
        if message.key in REFUSED:
            raise PermanentDeliveryError("refused by the receiver")
        delivered[message.key] += 1

    outbox = Outbox("race", deliver, backoff=(0,), batch_size=7)
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database_url), clock=SystemClock())
    await outbox.claim_name("default")

    outcomes: list[RunFinished] = []
    scheduler = Scheduler()

    @scheduler.job(every(seconds=0.2), id="ticker")
    async def ticker(ctx: JobContext) -> None:
        # Many prunes run while it holds its running lease, and the slots that come
        # meanwhile are recorded skipped_overlap, newer than its run: the running run is
        # not among the job's newest (keep=1), only its status keeps it.
        await asyncio.sleep(1.0)

    scheduler.observe(on_run=outcomes.append)
    await start_scheduler(scheduler)

    async def enqueue_and_drain() -> None:
        for start in range(0, len(KEYS), 6):
            async with database.sessions() as session, session.begin():
                for key in KEYS[start : start + 6]:
                    await outbox.enqueue(session, {"key": key}, key=key)
            await outbox.drain_once()

    drains = asyncio.create_task(enqueue_and_drain())
    prunes = removed = newest = 0
    async with asyncio.timeout(60):
        while not (drains.done() and statuses_ok(outcomes) >= 3 and prunes > 10):
            async with database.sessions() as session:
                report = await prune(session, "default", EAGER)
            prunes += 1
            removed += report.total
            async with database.engine.connect() as conn:
                assert (await conn.execute(_LEASE_WITHOUT_ITS_RUN)).scalar_one() == 0
                # Once the job has a run, its newest is always there.
                now_newest = (await conn.execute(_NEWEST_RUN)).scalar_one() or 0
                assert now_newest >= newest
                newest = now_newest
    await drains
    await outbox.drain_once()

    assert removed > 0 and prunes > 10
    statuses = collections.Counter(event.status for event in outcomes)
    assert set(statuses) == {"ok", "skipped_overlap"} and statuses["ok"] >= 3, statuses
    assert delivered == collections.Counter({key: 1 for key in KEYS if key not in REFUSED})
    async with database.engine.connect() as conn:
        assert set((await conn.execute(_STUCK_KEYS)).scalars()) == REFUSED
        assert (await conn.execute(_BROKEN)).scalar_one() == 0
