"""Every PostgreSQL advisory lock key this codebase owns, in one table.

A reused key silently disables whichever side loses the race, so a new key is added
here and to docs/DESIGN.md's table, never inlined.

| key       | kind    | meaning                                   |
|-----------|---------|-------------------------------------------|
| 911000001 | session | this process owns the schedule            |
| 911000002 | -       | reserved: a future drain loop             |
| 911000003 | -       | reserved: per-tenant admission (seed)     |
| 8110731   | session | serialises `alembic upgrade head`         |
"""

from typing import Final

__all__ = ["LEADER_KEY_LOCKS", "MIGRATION_LOCK_KEY", "SCHEDULER_LEADER_KEY"]

SCHEDULER_LEADER_KEY: Final = 911_000_001
MIGRATION_LOCK_KEY: Final = 8_110_731

# The pg_locks rows of the leader key in this database: the one predicate every reader
# (ownership check, slot-claim fence, admin view, tests) uses; add ``granted`` or ``NOT
# granted`` and a pid. A one-bigint advisory key shows as classid = its high 32 bits,
# objid = its low 32 bits, objsubid = 1; the two-int4 form pg_advisory_lock(a, b) shows
# as classid = a, objid = b, objsubid = 2. So objid alone also matches other sessions'
# unrelated keys. pg_locks is cluster-wide and an advisory key is per database.
LEADER_KEY_LOCKS: Final = f"""
    locktype = 'advisory' AND classid = {SCHEDULER_LEADER_KEY >> 32}
    AND objid = {SCHEDULER_LEADER_KEY & 0xFFFFFFFF} AND objsubid = 1
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
