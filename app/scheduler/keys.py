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

__all__ = ["MIGRATION_LOCK_KEY", "SCHEDULER_LEADER_KEY"]

SCHEDULER_LEADER_KEY: Final = 911_000_001
MIGRATION_LOCK_KEY: Final = 8_110_731
