"""JobStore: the store of one process for one schedule, made of its parts (one module
each): the job rows read and registered, the claim, the runs' outcomes, the running
leases, the reaper and the schedule's own rows."""

from __future__ import annotations

from .claims import ClaimStore
from .leases import LeaseStore
from .reap import ReapStore
from .registration import RegistrationStore
from .rows import JobRowStore
from .runs import RunStore
from .schedule import ScheduleStore

__all__ = ["JobStore"]


class JobStore(
    JobRowStore, RegistrationStore, ClaimStore, RunStore, LeaseStore, ReapStore, ScheduleStore
):
    """Reads and writes scheduler_jobs and scheduler_runs for one process, for the
    schedule named ``schedule``: every statement is bound to it, so the rows of another
    schedule in the same database are never read or written.

    ``lease_clock``: the clock running leases are written and compared on (see
    clock.lease_clock); None, the database server's. Leases are given as lengths in
    seconds, never as instants of this process's clock."""
