"""Shared by the benchmarks: a throwaway PostgreSQL with a migrated database."""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.db import Database, asyncpg_dsn, migrate
from app.localpg import LocalPostgres, free_port
from app.localpg.access import APP_ROLE
from app.scheduler import Role, Scheduler, SchedulerConfig

REPOSITORY = Path(__file__).resolve().parents[1]


def migrate_as_the_repository(url: str) -> None:
    """Migrate ``url`` as `python -m app migrate` from this repository does: Regent's
    migrations, then the repository's own (the demo jobs' tables), which an app started
    from the repository's root checks at start."""
    # Imported here: it loads the app's settings, and the benches' child processes,
    # whose memory some measure, run the engine alone.
    from app.user_migrations import user_migrations

    migrate(url, user_migrations("migrations", base=REPOSITORY))


@contextlib.contextmanager
def migrated_database() -> Iterator[str]:
    """Start a local server in a temporary directory; yield the URL of a migrated db."""
    root = Path(tempfile.mkdtemp(prefix="regent-bench-"))
    root.chmod(0o755)
    server = LocalPostgres(root / "data", port=free_port(), fsync=False)
    server.start()
    try:
        migrate_as_the_repository(server.url)
        # Benches clone the migrated database per case (bench/scale.py): the app's role
        # may not create databases on its own server (app/localpg/access.py).
        with psycopg.connect(server.superuser_conninfo("postgres"), autocommit=True) as conn:
            conn.execute(f"ALTER ROLE {APP_ROLE} CREATEDB".encode())
        yield server.url
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of ``values`` (fraction in 0..1)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def start_leading(scheduler: Scheduler, database: Database) -> None:
    """Start ``scheduler`` on ``database`` with no handover grace; return once it leads."""
    supervisor = await scheduler.start(
        SchedulerConfig(lock_dsn=asyncpg_dsn(database.url), handover_grace_seconds=0),
        engine=database.engine,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
    )
    await supervisor.wait_for_role(Role.LEADER)
