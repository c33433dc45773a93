"""Job fixtures: a workspace, fake outside systems, the FakeClock."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from app.db import Database
from app.jobs.gateways import ChargeResult, Update
from app.scheduler import FakeClock, JobContext

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


class FakeSms:
    """Records every SMS; ``fail_for`` phones raise."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []
        self.fail_for: set[str] = set()

    async def send(self, phone: str, text: str) -> None:
        if phone in self.fail_for:
            raise ConnectionError("gateway down")
        self.sent.append((phone, text))


class Crash(BaseException):
    """Stands in for the process dying at a given point (not an Exception: nothing in
    the job may catch it)."""


class FakePayments:
    """A PSP that records charges by reference, like an idempotent real one."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}
        self.calls: list[str] = []
        self.crash_before_charge = False
        self.crash_after_charge = False

    async def charge(self, reference: str, amount_cents: int) -> ChargeResult:
        self.calls.append(reference)
        if self.crash_before_charge:
            raise Crash("died before the provider call")
        self.charges.setdefault(reference, amount_cents)
        if self.crash_after_charge:
            raise Crash("died after the provider charged")
        return ChargeResult("succeeded", f"ch_{reference[:8]}")

    async def lookup(self, reference: str) -> ChargeResult:
        if reference in self.charges:
            return ChargeResult("succeeded", f"ch_{reference[:8]}")
        return ChargeResult("unknown")


class FakeUpdates:
    """A long-poll source with a fixed backlog; counts concurrent consumers."""

    def __init__(self, backlog: Sequence[Update]) -> None:
        self.backlog = list(backlog)
        self.offsets: list[int] = []
        self.active = 0
        self.most_active = 0

    async def get_updates(self, offset: int, timeout: float) -> Sequence[Update]:
        import asyncio

        self.active += 1
        self.most_active = max(self.most_active, self.active)
        try:
            self.offsets.append(offset)
            ready = [u for u in self.backlog if u.update_id >= offset][:2]
            if not ready:
                await asyncio.sleep(min(timeout, 0.05))
            return ready
        finally:
            self.active -= 1


def thread_run_context(database: Database, job_id: str, *, term: int) -> JobContext:
    """What a thread job's body receives from a run claimed under leadership ``term``."""
    return JobContext(
        job_id=job_id,
        name=job_id,
        scheduled_at=NOW,
        clock=FakeClock(NOW),
        log=logging.LoggerAdapter(logging.getLogger(f"regent.job.{job_id}"), {"job_id": job_id}),
        term=term,
        _sync_sessions=database.sync_sessions,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
async def workspace(database: Database) -> int:
    async with database.engine.begin() as conn:
        result = await conn.execute(
            text("INSERT INTO workspaces (name) VALUES ('acme') RETURNING id")
        )
        return int(result.scalar_one())
