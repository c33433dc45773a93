"""Run history: kept RUN_HISTORY_DAYS on the database's clock, never fewer than the
last RUN_HISTORY_KEEP runs of a job, a running run never deleted."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.retention import RetentionPolicy, prunable, prune

from .conftest import DAY, History

POLICY = RetentionPolicy(run_history_days=30, run_history_keep=3, outbox_delivered_days=7)


async def _newest_runs(history: History, job_id: str, count: int) -> set[int]:
    """``count`` runs of the last minutes, written after (so with ids above) every run
    a test wrote before, as a job's runs are."""
    return {await history.run(job_id, age=60 - n) for n in range(count)}


async def test_a_run_older_than_the_days_goes_and_a_younger_one_stays(
    history: History, session: AsyncSession
) -> None:
    just_older = await history.run("busy", age=30 * DAY + 60)
    just_younger = await history.run("busy", age=30 * DAY - 60)
    kept = await _newest_runs(history, "busy", 3)
    report = await prune(session, "default", POLICY)
    assert report.runs == 1
    assert await history.run_ids("busy") == kept | {just_younger}
    assert just_older not in await history.run_ids()


async def test_the_last_keep_runs_of_a_job_stay_whatever_their_age(
    history: History, session: AsyncSession
) -> None:
    ids = [await history.run("monthly", age=(400 - n * 30) * DAY) for n in range(5)]
    await prune(session, "default", POLICY)
    # Ids follow insertion: the three written last are the job's newest.
    assert await history.run_ids("monthly") == set(ids[-3:])


async def test_a_job_with_fewer_runs_than_keep_keeps_them_all_whatever_their_age(
    history: History, session: AsyncSession
) -> None:
    ids = {await history.run("yearly", age=(700 - n * 365) * DAY) for n in range(2)}
    await prune(session, "default", POLICY)
    assert await history.run_ids("yearly") == ids


async def test_a_running_run_is_never_deleted_whatever_its_age(
    history: History, session: AsyncSession
) -> None:
    running = await history.run("long", age=90 * DAY, status="running")
    await _newest_runs(history, "long", 3)
    await prune(session, "default", POLICY)
    assert running in await history.run_ids("long")


async def test_another_schedules_runs_are_left_alone(
    history: History, session: AsyncSession
) -> None:
    theirs = await history.run("billing_job", age=90 * DAY, schedule="billing")
    for n in range(3):
        await history.run("billing_job", age=60 + n, schedule="billing")
    await prune(session, "default", POLICY)
    assert theirs in await history.run_ids("billing_job")


async def test_a_dry_run_counts_what_a_prune_deletes_and_deletes_nothing(
    history: History, session: AsyncSession
) -> None:
    for n in range(5):
        await history.run("busy", age=(36 - n) * DAY)
    await _newest_runs(history, "busy", 3)
    before = await history.run_ids()
    counted = await prunable(session, "default", POLICY)
    assert await history.run_ids() == before
    assert counted.runs == 5
    assert (await prune(session, "default", POLICY)).runs == 5


async def test_a_prune_deletes_in_batches_until_none_is_left(
    history: History, session: AsyncSession
) -> None:
    for n in range(25):
        await history.run("busy", age=40 * DAY - n)
    kept = await _newest_runs(history, "busy", 3)
    small = RetentionPolicy(
        run_history_days=30, run_history_keep=3, outbox_delivered_days=7, batch_size=4
    )
    report = await prune(session, "default", small)
    assert report.runs == 25
    assert await history.run_ids() == kept


async def test_a_run_whose_start_is_out_of_step_with_its_id_holds_up_no_other_old_run(
    history: History, session: AsyncSession
) -> None:
    # Recorded first, started after the others: a database clock that was ahead.
    await history.run("ahead", age=29 * DAY)
    old = [await history.run("busy", age=(90 - n) * DAY) for n in range(10)]
    kept = await _newest_runs(history, "busy", 3)
    counted = await prunable(session, "default", POLICY)
    report = await prune(session, "default", POLICY)
    assert (counted.runs, report.runs) == (10, 10)
    assert await history.run_ids("busy") == kept
    assert not set(old) & await history.run_ids()
