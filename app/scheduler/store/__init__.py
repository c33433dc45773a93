"""The scheduler's tables: job rows, slot claims and run history.

The claim is the heart of at-most-once: a conditional UPDATE that moves a job's
``next_run_at`` from the due slot to the next one, committed with the run's history row
before the body runs. Two processes that both think a slot is due race on that
UPDATE, and PostgreSQL lets exactly one of them match the row. A claim never waits on
a row: it first locks the rows of its jobs that no other transaction holds (SKIP
LOCKED) and updates only those; a held row (an operator's open transaction) leaves its
job out, answered ``JobRowBusyError``, and its claim is made again later. A leader
claims every slot due at one wake of its timer in ONE such UPDATE over the jobs' rows
(``claim_many``), each row under the conditions it would meet alone; the one-job
claim is its one-row case. A claim may be *prepared* ahead of its slot
(``PreparedCommit``): its statements run early, its transaction holds the claimed rows
until the slot, and only the commit is left for the slot itself, so a thousand bodies
that share a slot start on time; a demotion before the commit rolls it back and leaves
the slot to the next leader. A guarded leader adds a
fence to the same statement: the claim matches only while the leader's own lock
connection (by backend pid) still holds the key, so a leader that lost its lock while
paused cannot claim a slot after it wakes.

The claim also reads the leadership term (scheduler_leadership.term, which every
promotion moves while it holds the key) and the run keeps it: the job's own commit is
fenced by it (``JobContext.fence``). A fenced claim sees its own leadership's term,
since a newer term begins only after another process took the key, when the claim's
fence matches nothing.

The same UPDATE takes the job's *running lease* when it starts a run: it allocates the
run's id (``running_run_id``, the lease's token) and sets ``running_since``,
``running_until`` and the owner (``running_pid``, ``running_host``); the run's row,
inserted in the same commit, carries the lease's end too (``scheduler_runs.
running_until``), and that is where the lease lives: the owner renews it there, and
copies it to the job row only where no other transaction holds that row, so a job row
held elsewhere (an operator's ``SELECT ... FOR UPDATE``) keeps no renewal out. While
the job row names a run, a claim that would start one records its slot as
``skipped_overlap`` instead, whichever process holds the lease; the claim's reap, in
the same transaction, first clears a lease that ran out on both rows (with the run row
locked, so a renewal under way keeps it). The owner clears the lease with the run's
outcome; renewing and clearing match on the run id, and a reap clears the run row's
end, so a lease that ran out and was taken by a newer run is left alone.

Leases are given as lengths and measured on the *lease clock*: the database server's
(``clock_timestamp()``), the one clock every process shares, or a test's FakeClock
(``lease_now``; see clock.lease_clock). A host's clock never decides whether another
host's run still lives.

The lease is also the truth for "running": a skipped or missed slot never overwrites
the job's ``running`` status while a lease holds, and a lease that ran out (its owner
died) is *reaped*: its run and the job's status become ``abandoned`` and the lease is
cleared, by the leader every tick and by the claim that takes the job over. A process
never reaps a lease it renews itself (the runs its caller gives as ``renewing``): the
body runs there.

A service copy holds a running lease on its own row (``scheduler_service_runs``, named
on its service's row in ``scheduler_services``), taken as it starts, only while no other
copy's lease holds, renewed with every other lease of its process and released (with a
NOTIFY that wakes a leader waiting for it) once the copy's task and every thread it
started ended. Every lease's token is a run id, so the leases a process renews are told
apart by token alone.

A per-worker run (``scope = 'replica'``) holds its lease on its own run row instead
(``scheduler_runs.running_until``): every worker runs the job at once, so the job row
cannot hold one lease for them. It is set by the insert that starts the run, renewed
by the run id, and cleared by the outcome; it holds no claim back. The start also sets
the job's last status to 'running' (the outcome settles it), and the job reads as
running while any of its run leases holds. A run whose lease ran out is reaped to
``abandoned`` by the leader's tick (the same reap) and by the job's next run on any
worker, so it is reaped even while no worker leads.

*Run now* is a request beside the schedule, never a move of it: the operator's request
sets ``run_requested_at`` (app/operations/jobs.py) and the leader claims it with the same
UPDATE, matched on the request instead of the slot, which clears the request instead of
moving ``next_run_at``. Its run row is ``manual``, its slot is the request time and the
one-run-per-slot index keeps manual and scheduled runs apart, so a request never takes
the place of a slot, nor a slot of a request.

A job whose row or next slot the leader cannot handle is recorded in
``scheduler_broken_jobs`` (a table of its own: the job's row may be what cannot be
written) until a later registration or claim of it succeeds.

The store speaks SQL and nothing else, one module per noun (JobStore, in job_store.py,
is made of their parts): rows.py, the job rows read (a promotion's, the changes since a
horizon); registration.py, the job rows written at registration and the broken marks;
busy.py, a claim's free rows locked and the held ones named; slots.py, what a claim is
asked for and answers; claims.py, the claim's steps; claim_runs.py, the run rows it
records; prepared.py, a claim held open until its slot (it waits on the clock itself);
runs.py, the outcomes (the one writer, for the loop and for threads) and a per-worker
run's start; leases.py, the renewal of running leases and the service leases; reap.py,
the one reaper; schedule.py, the schedule's name and leadership rows; thread_store.py,
the same writes from a thread (ThreadStore); base.py, what they share: the store's
binding, the text arrays, and the one runner of a sequence of statements on either
engine.
"""

from .job_store import JobStore
from .leases import HeldLease, LeaseKind, ServiceTake
from .prepared import PreparedClaimDropped, PreparedCommit
from .reap import ReapedRun
from .registration import LeaderRow
from .rows import ChangedRows, JobRow, StoredJob, StoredJobs
from .runs import Outcome, format_error
from .schedule import LeaderJobs
from .slots import ClaimedSlot, SlotClaim
from .thread_store import ThreadStore

__all__ = [
    "ChangedRows",
    "ClaimedSlot",
    "HeldLease",
    "JobRow",
    "JobStore",
    "LeaderJobs",
    "LeaderRow",
    "LeaseKind",
    "Outcome",
    "PreparedClaimDropped",
    "PreparedCommit",
    "ReapedRun",
    "ServiceTake",
    "SlotClaim",
    "StoredJob",
    "StoredJobs",
    "ThreadStore",
    "format_error",
]
