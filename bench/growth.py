"""What each operator surface costs with a busy deployment's history present: every
surface's median answer time on an empty database and after a bulk load of run history
and delivered outbox rows, side by side, from one run; the lateness of a 1 s job in
both; and how long one retention batch (a DELETE of 1000 rows) takes on the filled
database. The surfaces: the admin API's job list, runs and outbox counts, the admin
page (signed in: it shows the jobs and the outbox counts), `/metrics`, the health
check, and the reads behind the CLI's `jobs` and `outbox list` (timed in-process: a
CLI's own interpreter start is the same with any history).

The app is `create_app(settings, scheduler)` in this process (served through httpx's
ASGI transport, so the times are the app's and the database's, not a network's), its
scheduler leading with a 1 s job and an outbox. Both phases have the same 50 job rows
(the load spreads its runs over them) and the same live work; the load only adds
history: ``--runs`` finished runs started over the last 23 days and ``--delivered``
rows delivered over the last 7 days (what OUTBOX_DELIVERED_DAYS keeps) and ``--recent``
rows delivered over the last 50 minutes (a busy outbox's last hour), then VACUUM
ANALYZE, as autovacuum would. The retention batches are timed last, with a policy that
makes most of the load prunable (7 days of runs, 3 of deliveries).

    python bench/growth.py [--runs 2000000] [--delivered 1000000] [--recent 500000]
        [--samples 30]
        [--lateness-seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time

import httpx
from _server import migrated_database, percentile
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.main import create_app
from app.operations.jobs import list_jobs
from app.operations.outboxes import list_outboxes
from app.outbox import Message, Outbox
from app.outbox.retention import prune_delivered_batch
from app.retention import BATCH_SIZE
from app.scheduler import JobContext, Role, Scheduler, every
from app.scheduler.clock import SystemClock, lease_now
from app.scheduler.store.retention import prune_runs_batch
from app.settings import load_settings

TOKEN = "growth-bench-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOBS = 50
SURFACES = {
    "GET /admin/api/jobs": "/admin/api/jobs",
    "GET /admin/api/jobs/{id}/runs": "/admin/api/jobs/history_0/runs",
    "GET /admin/api/outboxes": "/admin/api/outboxes",
    "GET /metrics": "/metrics",
    "GET /health/scheduler": "/health/scheduler",
    "GET /admin (the page, signed in)": "{page}",
}
CLI_READS = ("CLI jobs (its read)", "CLI outbox list (its read)")
CHUNK = 200_000

# The 50 jobs the load's runs belong to, paused (nothing fires them): rows of an app's
# registered jobs, there in both phases.
_JOB_ROWS = text(
    "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at, paused)"
    " SELECT 'history_' || n, 'history ' || n, 'every 1s', now() + interval '1 day', true"
    " FROM generate_series(0, :jobs - 1) n"
)
_RUNS = text(
    "INSERT INTO scheduler_runs (schedule, job_id, scope, slot, started_at, finished_at,"
    " status, lateness_ms, duration_ms, pid, host)"
    " SELECT 'default', 'history_' || (n % :jobs), 'leader', t, t, t + interval '5 ms',"
    " 'ok', 3, 5, 1, 'bench'"
    " FROM (SELECT n, now() - interval '23 days'"
    "     + make_interval(secs => 23 * 86400.0 * n / :total) AS t"
    "     FROM generate_series(:start, :stop - 1) n) s"
)
_DELIVERED = text(
    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
    " created_at, updated_at, delivered_at)"
    " SELECT 'mails', 'filled-' || n, '{\"to\": \"someone\"}', 'delivered', 1, t, t, t, t"
    " FROM (SELECT n, now() - interval '7 days'"
    "     + make_interval(secs => 7 * 86400.0 * n / :total) AS t"
    "     FROM generate_series(:start, :stop - 1) n) s"
)
# A burst: as many rows delivered over the last 50 minutes (a busy outbox's last hour
# holds as many rows as it delivered; the counts of the last hour must not read them).
_RECENT = text(
    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
    " created_at, updated_at, delivered_at)"
    " SELECT 'mails', 'recent-' || n, '{\"to\": \"someone\"}', 'delivered', 1, t, t, t, t"
    " FROM (SELECT n, now() - interval '50 minutes'"
    "     + make_interval(secs => 3000.0 * n / :total) AS t"
    "     FROM generate_series(:start, :stop - 1) n) s"
)


async def _sign_in(client: httpx.AsyncClient) -> str:
    """Sign in to the admin page as a browser does (the client keeps the cookie); the
    path of the session's page (/admin/s/<sid>/)."""
    form = await client.get("/admin")
    found = re.search(r'name="csrf" value="([^"]+)"', form.text)
    if found is None:
        raise RuntimeError(f"no sign-in form at /admin: {form.status_code}")
    signed = await client.post("/admin/login", data={"token": TOKEN, "csrf": found[1]})
    if signed.status_code != 303:
        raise RuntimeError(f"sign-in refused: {signed.status_code}")
    page = signed.headers["location"]
    if 'name="token"' in (await client.get(page)).text:
        raise RuntimeError(f"signed in, but {page} still shows the sign-in form")
    return str(page)


async def _surfaces(
    client: httpx.AsyncClient, database: Database, samples: int, page: str
) -> dict[str, float]:
    medians = {}
    clock = SystemClock()
    reads = {
        CLI_READS[0]: lambda: list_jobs(database.engine, lease_now(clock)),
        CLI_READS[1]: lambda: list_outboxes(database.engine, lease_now(clock)),
    }
    for label, read in reads.items():
        times = []
        for _ in range(samples):
            began = time.perf_counter()
            await read()
            times.append(time.perf_counter() - began)
        medians[label] = statistics.median(times)
    for label, path in SURFACES.items():
        times = []
        for _ in range(samples):
            began = time.perf_counter()
            response = await client.get(path.format(page=page), headers=AUTH)
            times.append(time.perf_counter() - began)
            if response.status_code not in (200, 503):
                raise RuntimeError(f"{path}: {response.status_code} {response.text[:200]}")
        medians[label] = statistics.median(times)
    return medians


async def _lateness(lateness: list[float], seconds: float) -> list[float]:
    start = len(lateness)
    await asyncio.sleep(seconds)
    return lateness[start:]


async def _fill(database: Database, runs: int, delivered: int, recent: int) -> float:
    began = time.perf_counter()
    for statement, total in ((_RUNS, runs), (_DELIVERED, delivered), (_RECENT, recent)):
        for start in range(0, total, CHUNK):
            async with database.engine.begin() as conn:
                params = {"jobs": JOBS, "total": total, "start": start}
                await conn.execute(statement, params | {"stop": min(total, start + CHUNK)})
    async with database.engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE scheduler_runs"))
        await conn.execute(text("VACUUM ANALYZE outbox_messages"))
    return time.perf_counter() - began


async def _prune_batches(database: Database, batches: int) -> dict[str, list[float]]:
    """Times of ``batches`` retention batches of each kind on the filled database."""
    times: dict[str, list[float]] = {"runs": [], "delivered": []}
    async with database.sessions() as session:
        for _ in range(batches):
            began = time.perf_counter()
            await prune_runs_batch(session, schedule="default", days=7, keep=100, batch=BATCH_SIZE)
            times["runs"].append(time.perf_counter() - began)
            began = time.perf_counter()
            await prune_delivered_batch(session, outbox="mails", days=3, batch=BATCH_SIZE)
            times["delivered"].append(time.perf_counter() - began)
    return times


async def _measure(url: str, args: argparse.Namespace) -> None:
    lateness: list[float] = []
    scheduler = Scheduler()

    @scheduler.job(every(seconds=1), id="every_second")
    async def every_second(ctx: JobContext) -> None:
        # On the scheduler's clock, the one its slots are due on (the server's).
        lateness.append((ctx.clock.now() - ctx.scheduled_at).total_seconds())

    async def deliver(message: Message) -> None:
        return None

    Outbox("mails", deliver, scheduler=scheduler)
    settings = load_settings(
        _env_file=None,
        DATABASE_URL=url,
        ADMIN_TOKEN=SecretStr(TOKEN),
        HANDOVER_GRACE_SECONDS=0,
    )
    database = Database.from_url(url)
    async with database.engine.begin() as conn:
        await conn.execute(_JOB_ROWS, {"jobs": JOBS})
    app = create_app(settings, scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.LEADER)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            empty_late = await _lateness(lateness, args.lateness_seconds)
            page = await _sign_in(client)
            await _surfaces(client, database, 3, page)  # warm: first plans, first pages
            empty = await _surfaces(client, database, args.samples, page)
            print(
                f"filling {args.runs:,} runs, {args.delivered:,} delivered rows and"
                f" {args.recent:,} delivered in the last 50 minutes ..."
            )
            took = await _fill(database, args.runs, args.delivered, args.recent)
            print(f"filled in {took:.0f} s")
            filled_late = await _lateness(lateness, args.lateness_seconds)
            filled = await _surfaces(client, database, args.samples, page)
            pruning = await _prune_batches(database, args.prune_batches)
    await database.dispose()

    print(
        f"\nmedian of {args.samples} requests; empty vs {args.runs:,} run rows and "
        f"{args.delivered + args.recent:,} delivered rows ({args.recent:,} in the last hour); ms"
    )
    print(f"{'surface':<32} {'empty':>8} {'filled':>8} {'growth':>7}")
    for label in (*SURFACES, *CLI_READS):
        ratio = filled[label] / empty[label]
        print(
            f"{label:<32} {empty[label] * 1000:>8.1f} {filled[label] * 1000:>8.1f} {ratio:>6.2f}x"
        )
    print(f"\nlateness of every(seconds=1) over {args.lateness_seconds:g} s each; ms")
    print(f"{'phase':<32} {'fires':>8} {'p50':>8} {'p99':>8}")
    for phase, values in (("empty", empty_late), ("filled", filled_late)):
        print(
            f"{phase:<32} {len(values):>8} {percentile(values, 0.5) * 1000:>8.1f}"
            f" {percentile(values, 0.99) * 1000:>8.1f}"
        )

    print(f"\nretention batches of {BATCH_SIZE} rows on the filled database; ms")
    print(f"{'batch':<32} {'count':>8} {'p50':>8} {'max':>8}")
    for kind, values in pruning.items():
        print(
            f"{kind:<32} {len(values):>8} {percentile(values, 0.5) * 1000:>8.1f}"
            f" {max(values) * 1000:>8.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2_000_000)
    parser.add_argument("--delivered", type=int, default=1_000_000)
    parser.add_argument("--recent", type=int, default=500_000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--lateness-seconds", type=float, default=30)
    parser.add_argument("--prune-batches", type=int, default=20)
    args = parser.parse_args()
    with migrated_database() as url:
        asyncio.run(_measure(url, args))


if __name__ == "__main__":
    main()
