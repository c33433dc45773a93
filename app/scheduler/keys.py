"""Every PostgreSQL advisory lock key this codebase owns, in one table.

A reused key silently disables whichever side loses the race, so a new key is added
here and to docs/DESIGN.md's table, never inlined.

| key                          | kind    | meaning                                    |
|------------------------------|---------|--------------------------------------------|
| 911000001                    | session | this process leads the `default` schedule  |
| (911000001, schedule_hash(n))| session | this process leads the schedule named n    |
| 911000002                    | -       | reserved: a future drain loop              |
| 911000003                    | -       | reserved: per-tenant admission (seed)      |
| 8110731                      | session | serialises `alembic upgrade head`          |

Schedules are namespaced: each Scheduler has a name, and its leader key is its name's.
The name ``default`` keeps the one-bigint key 911000001 that every release before names
used, so in a rolling deploy old and new workers of the default schedule queue for the
same key and never lead side by side. Any other name takes the two-int4 form
``pg_advisory_lock(911000001, schedule_hash(name))``: pg_locks shows it with
objsubid = 2, so it never equals a one-bigint key (objsubid = 1), whatever the hash.
``schedule_hash`` is the first 4 bytes of SHA-256 of ``regent-schedule:<name>``, a
signed int4, computed here (not by the server, so it never changes with the server's
version). Two names can hash alike; the table ``scheduler_schedules`` keeps each
started name with its key's pg_locks coordinates under a UNIQUE constraint, and a
scheduler whose name collides with another's in its database refuses to start
(ScheduleNameCollisionError naming both).

The scheduler's NOTIFY channel is named here too (``WAKE_CHANNEL``): like a key, it is
shared by every app of the database. A NOTIFY on it wakes the leader, whose lock
connection LISTENs: it reloads its job rows at once (an operator's pause, resume or run
now), and a leader waiting to start a service tries to take the service's lease again
(a copy's release sends it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from .errors import SchedulerError

__all__ = [
    "DEFAULT_SCHEDULE",
    "LEADER_KEY_LOCKS",
    "LEADER_KEY_LOCKS_BOUND",
    "MIGRATION_LOCK_KEY",
    "SCHEDULER_LEADER_KEY",
    "WAKE_CHANNEL",
    "InvalidScheduleNameError",
    "LeaderKey",
    "leader_key_locks",
    "schedule_hash",
    "validate_schedule_name",
]

SCHEDULER_LEADER_KEY: Final = 911_000_001
MIGRATION_LOCK_KEY: Final = 8_110_731
DEFAULT_SCHEDULE: Final = "default"
WAKE_CHANNEL: Final = "regent_scheduler"

# Letters, digits and a few separators: the name shows in log lines, pg_locks readers,
# health bodies and the admin page, so it must read plainly and fit a line.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}")


class InvalidScheduleNameError(SchedulerError, ValueError):
    """A schedule name that is empty, too long, or has characters other than letters,
    digits, ``_``, ``.``, ``:`` and ``-``."""


def validate_schedule_name(name: object) -> str:
    """Return ``name`` when it is a valid schedule name; raise InvalidScheduleNameError
    naming it and the rule otherwise."""
    if not isinstance(name, str) or _NAME.fullmatch(name) is None:
        raise InvalidScheduleNameError(
            f"schedule name {name!r} is not valid: use 1 to 63 letters, digits, '_', '.', "
            "':' or '-', starting with a letter or digit (Scheduler(name=...) or "
            "SCHEDULER_NAME)"
        )
    return name


def schedule_hash(name: str) -> int:
    """The second int4 of a non-default schedule's key: the first 4 bytes of SHA-256 of
    ``regent-schedule:<name>``, big-endian, signed."""
    digest = hashlib.sha256(f"regent-schedule:{name}".encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


def leader_key_locks(classid: str, objid: str, objsubid: str) -> str:
    """The pg_locks rows of a leader key in this database: the one predicate every
    reader (ownership check, slot-claim fence, admin view, tests) uses; add ``granted``
    or ``NOT granted`` and a pid. The arguments are SQL expressions (literals, or bind
    parameters where one statement serves every schedule).

    A one-bigint advisory key shows as classid = its high 32 bits, objid = its low 32
    bits, objsubid = 1; the two-int4 form pg_advisory_lock(a, b) shows as classid = a,
    objid = b (as an unsigned oid), objsubid = 2. So objid alone also matches other
    sessions' unrelated keys. pg_locks is cluster-wide and an advisory key is per
    database.
    """
    return f"""
    locktype = 'advisory' AND classid = {classid}
    AND objid = {objid} AND objsubid = {objsubid}
    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


@dataclass(frozen=True)
class LeaderKey:
    """The advisory key of one schedule: how to lock it and how pg_locks shows it."""

    schedule: str
    # The arguments of pg_advisory_lock: one bigint, or two int4.
    args: tuple[int, ...]
    classid: int
    objid: int
    objsubid: int

    @classmethod
    def of(cls, schedule: str) -> LeaderKey:
        """The key of the schedule named ``schedule`` (validated)."""
        validate_schedule_name(schedule)
        if schedule == DEFAULT_SCHEDULE:
            key = SCHEDULER_LEADER_KEY
            return cls(schedule, (key,), key >> 32, key & 0xFFFFFFFF, 1)
        second = schedule_hash(schedule)
        return cls(
            schedule,
            (SCHEDULER_LEADER_KEY, second),
            SCHEDULER_LEADER_KEY,
            second & 0xFFFFFFFF,
            2,
        )

    def call(self, function: str) -> str:
        """``SELECT function(<key>)`` with asyncpg placeholders for ``args``."""
        placeholders = ", ".join(f"${i}" for i in range(1, len(self.args) + 1))
        return f"SELECT {function}({placeholders})"

    @property
    def locks(self) -> str:
        """leader_key_locks of this key, as literals."""
        return leader_key_locks(str(self.classid), str(self.objid), str(self.objsubid))

    @property
    def bind_params(self) -> dict[str, int]:
        """The values of LEADER_KEY_LOCKS_BOUND's bind parameters for this key."""
        return {"key_classid": self.classid, "key_objid": self.objid, "key_objsubid": self.objsubid}

    @property
    def host_lock_id(self) -> str:
        """What names this key in the host lock's file name: the bare key for the
        default schedule (the name every release before schedules used)."""
        return ":".join(str(arg) for arg in self.args)


# The default schedule's rows, for readers that only ever look at it (tests, seed).
LEADER_KEY_LOCKS: Final = LeaderKey.of(DEFAULT_SCHEDULE).locks
# The same predicate on bind parameters (:key_classid, :key_objid, :key_objsubid), for
# a statement that serves every schedule; LeaderKey.bind_params fills them.
LEADER_KEY_LOCKS_BOUND: Final = leader_key_locks(
    "CAST(:key_classid AS bigint)", "CAST(:key_objid AS bigint)", "CAST(:key_objsubid AS int)"
)
