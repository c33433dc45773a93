"""What the delivery-count triggers (migration 0027) cost the statements a drain runs.

Outcome writes that deliver 50 rows, and claim-like writes of 50 rows that deliver
none, timed with the triggers on and off, alternating, in one database, so that the
ratio is read beside its own baseline.

    python bench/delivery_counts.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import asyncpg

from app.db import asyncpg_dsn
from app.testing.server import start_test_server

BATCH = 50
_FILL = (
    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
    " created_at, updated_at)"
    " SELECT 'bench', 'k' || n, '{}', 'pending', 0, now(), now(), now()"
    " FROM generate_series(1, $1) n"
)
_CLAIM = (
    "UPDATE outbox_messages SET claimed_by = gen_random_uuid(), next_attempt_at = now()"
    " WHERE id = ANY($1)"
)
_DELIVER = (
    "UPDATE outbox_messages SET status = 'delivered', delivered_at = now(),"
    " updated_at = now(), claimed_by = NULL WHERE id = ANY($1)"
)


async def _measure(url: str, rounds: int) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(_FILL, rounds * 4 * 10 * BATCH)  # fresh rows for each statement
        ids = [row[0] for row in await conn.fetch("SELECT id FROM outbox_messages ORDER BY id")]
        times: dict[tuple[str, bool], list[float]] = {}
        fresh = iter(range(0, len(ids), BATCH))
        for _ in range(rounds):
            for on in (True, False):
                switch = "ENABLE" if on else "DISABLE"
                await conn.execute(f"ALTER TABLE outbox_messages {switch} TRIGGER USER")
                for kind, statement in (("claim", _CLAIM), ("deliver", _DELIVER)):
                    began = time.perf_counter()
                    for _ in range(10):
                        start = next(fresh)
                        await conn.execute(statement, ids[start : start + BATCH])
                    times.setdefault((kind, on), []).append((time.perf_counter() - began) / 10)
        await conn.execute("ALTER TABLE outbox_messages ENABLE TRIGGER USER")
    finally:
        await conn.close()
    print(f"{'statement (50 rows)':<22}{'triggers on':>13}{'off':>10}{'ratio':>8}")
    for kind in ("claim", "deliver"):
        on = statistics.median(times[(kind, True)]) * 1e3
        off = statistics.median(times[(kind, False)]) * 1e3
        print(f"{kind:<22}{on:>10.3f} ms{off:>7.3f} ms{on / off:>7.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    server = start_test_server()
    try:
        asyncio.run(_measure(asyncpg_dsn(server.create_database()), args.rounds))
    finally:
        server.close()


if __name__ == "__main__":
    main()
