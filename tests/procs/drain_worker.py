"""A drain in its own process, for the cross-process outbox test.

    python -m tests.procs.drain_worker DATABASE_URL SEED

Drains outbox "shared" until no row is pending. Its receiver fails 20% of calls with a
500 and 5% with a 429 and, on success, records the key in table ``received`` (no
unique constraint: a double delivery would show as two rows).
"""

import asyncio
import os
import random
import sys

from sqlalchemy import text

from app.db import Database, asyncpg_dsn
from app.outbox import Message, Outbox, RetryableDeliveryError


async def main(url: str, seed: int) -> None:
    database = Database.from_url(url)
    chance = random.Random(seed)

    async def deliver(message: Message) -> None:
        roll = chance.random()
        if roll < 0.25:
            raise RetryableDeliveryError("500" if roll < 0.20 else "429")
        async with database.engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO received (key, pid) VALUES (:key, :pid)"),
                {"key": message.key, "pid": os.getpid()},
            )

    outbox = Outbox("shared", deliver, backoff=(0,), max_attempts=1000, batch_size=25)
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(url))
    pending = text("SELECT count(*) FROM outbox_messages WHERE status = 'pending'")
    try:
        while True:
            await outbox.drain_once()
            async with database.engine.connect() as conn:
                if (await conn.execute(pending)).scalar_one() == 0:
                    return
            await asyncio.sleep(0.01)
    finally:
        await database.dispose()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
