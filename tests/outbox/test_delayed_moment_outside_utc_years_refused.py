"""A delayed message's moment must be one PostgreSQL can be sent: an aware ``at``
that falls before year 1 in UTC (``datetime.min`` east of UTC) is refused at the call
with OutboxArgumentError naming ``at``, and nothing is written, never a driver's
OverflowError from inside the caller's transaction."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import text

from app.db import Database
from app.outbox import OutboxArgumentError

from .conftest import MakeOutbox

EAST = timezone(timedelta(hours=5))


async def test_a_moment_before_year_one_in_utc_is_refused_and_writes_nothing(
    database: Database, make_outbox: MakeOutbox
) -> None:
    outbox = make_outbox("reminders")
    with pytest.raises(OutboxArgumentError) as refused:
        async with database.sessions() as session, session.begin():
            await outbox.enqueue(session, {}, key="k", at=datetime.min.replace(tzinfo=EAST))
    assert refused.value.argument == "at"
    async with database.engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM outbox_messages"))).scalar() == 0
