"""Regent's scheduler: one leader per schedule name, slots that fire at most once.

How it stays correct
====================

Every worker (uvicorn process) runs one supervisor task. The supervisor opens a
dedicated *lock connection* (asyncpg, outside the pool, ``application_name =
'scheduler-leader:<pid>'``, ``idle_session_timeout`` = the lease, ``lock_timeout`` and
``statement_timeout`` = 0 so that no role or database default cuts a standby's wait)
and asks for the session advisory lock of its schedule: 911000001 for the ``default``
schedule, ``(911000001, schedule_hash(name))`` for any other name (``keys.py``: every
schedule's key, how it is derived and how a collision between two names is refused).
Every row the scheduler writes carries its schedule's name, so apps of different names
share one database, each with its own leader and jobs.

At connect the lock connection proves it can hold a session lock that the slot claims
will see: two statements must run on one backend (else LOCK_DATABASE_URL goes through a
transaction-pooling proxy), the server must not be in recovery (a replica), and it must
reach the same database of the same running server as the app's engine (else the
claims' fence, which looks for the key in the app's database, matches nothing and the
leader never fires). Any failure stops the scheduler with ``scheduler.refused``; the
API keeps serving. The leader's lock connection also LISTENs on ``regent_scheduler``, so
an operator's pause, resume or run-now reaches it at once (LISTEN opens no transaction).

States::

    STARTING -> STANDBY -(key granted)-> LEADER -(lost | stop)-> STANDBY ... -> STOPPED

- **Standby** blocks in ``pg_advisory_lock`` on its lock connection, so PostgreSQL
  wakes it the moment the key is released: takeover follows release within a second.
  Only one worker per host queues there: the workers of a host first take an
  exclusive flock on one file of REGENT_RUNTIME_DIR (``host_lock.py``), and only its
  holder opens a lock connection. The flock is the right to queue, not to lead: a
  holder that is granted the key lets go of it, so the leader's host queues a standby
  too (two lock connections there, one on every other host). When the holder dies the
  kernel drops the flock and another worker of the host joins the queue within a poll;
  when it hangs, the others pass it once its lock connection has been gone from the
  server for a lease (HOST_LOCK_ENABLED=false: every worker queues). A directory
  that another user made or can write is no refusal: that worker queues without the
  flock (``scheduler.host_lock_unusable``). A worker waiting for the flock has no
  session waiting for the key, so it keeps a row with a lease while it waits
  (``host_standbys.py``): operators count it as a standby behind the host lock.
- **Leader** waits ``HANDOVER_GRACE_SECONDS`` (so an old leader that is about to
  notice its loss has stopped), begins its term, upserts its jobs' rows, then runs one
  job timer for all of its jobs (wake.py; timetable.py: a heap of when each job acts
  next; each wake claims everything due in one statement) and one task per service (a copy
  starts only once no other copy holds the service's running lease; see below). The
  grace ends early once the recorded previous leader's backend has left pg_stat_activity
  (killed, terminated, lease run out): that leader can no longer claim (the fence
  below) nor commit a fenced write (its term is over), so a kill -9 is followed by a
  fire in a fraction of a second; a previous leader whose backend is still there (a
  graceful handover) gets the whole grace. Every ``LEADER_TICK_SECONDS`` it checks
  ownership with the seed's pg_locks query on one shared predicate (``keys.leader_key_locks`` of its
  schedule's key: this database, and that key's form only (for ``default`` the
  one-bigint form), so that ``pg_advisory_lock(0, 911000001)``
  is not taken for it); that query also renews the lease. It ticks through every wait,
  the handover and shutdown graces included, so no grace, however long, outlasts the
  lease of an idle connection.
- **Unguarded** (outside production, after a lock-check error): fires its jobs for one
  period without the key, the claims still firing each slot once; it starts no
  service, since services (long-poll consumers) must run on one process at most.

Every loop of these roles that acts, then waits (the supervisor's passes, the leader
tick, the job timer, the standby's watch, the lease keeper, the per-worker loops, a
service's restarts) is one step that returns its next delay, run by one driver
(``loop.run_loop``); a failed step answers its own retry policy's delay (retry.py).

The lease and what happens on each fault:

- *kill -9 of the leader*: its connection drops, the server releases the key, a
  standby's ``pg_advisory_lock`` returns.
- *pg_terminate_backend of the lock connection*: the asyncpg termination listener
  demotes the leader at once: running async jobs and services are cancelled, the
  connection is closed, the worker goes back to standby.
- *SIGSTOP*: the stopped leader sends nothing; after ``LEASE_SECONDS`` the server
  closes its idle session, releasing the key to the standby queued behind it (of its
  own host too, see above). A transaction it left open on the leadership row (a job's
  fenced commit, its heartbeat) would hold up the new leader's term: the promotion
  waits a leader tick for it, then ends it (``scheduler.old_term_transaction_ended``).
  After SIGCONT it can claim nothing (see below), commits nothing fenced, and demotes
  as soon as it reads its connection's end, at its first tick at the latest.
- *SIGSTOP of a standby holding its host's flock*: its backend waits for the key,
  which is not idle, so nothing ends it while a live leader leads. Should that leader
  go too, the hung standby is granted the key, its now idle session is ended a lease
  later, and a lease after that its host's other workers queue without the flock: the
  host leads again within two leases and a tick.
- *PostgreSQL restart*: every lock connection dies; all workers reconnect with
  backoff and exactly one wins the key.
- *graceful shutdown*: the leader stops firing, gives running jobs
  ``SHUTDOWN_GRACE_SECONDS`` while it keeps checking ownership every tick (a standby
  cannot be promoted while a body still runs; a lock lost meanwhile cancels them at
  once), unlocks and closes; a standby takes over at once. A thread body that outlasts
  the grace keeps its job's running lease until it ends (see below), so the new leader
  skips that job's slots meanwhile and fires all the others.
- *kill -9 or Ctrl-C of a standby*: its backend waits in ``pg_advisory_lock`` and
  reads nothing from the client, so the server checks the socket every
  ``CLIENT_CHECK_SECONDS`` (``client_connection_check_interval``) and ends the backend
  once the client closed it: the dead standby leaves the queue, and the ``leader``
  count, within a second or two, not at the next handover. TCP keepalives on both
  ends (``KEEPALIVE_SECONDS``) find a peer whose host vanished without a FIN.

Why a double fire is harmless anyway
====================================

Each fire first *claims* its slot: an UPDATE of ``scheduler_jobs`` that moves
``next_run_at`` from the due slot to the next one, committed with the run's history
row before the body runs. If two processes ever both believe they lead, PostgreSQL
lets only one UPDATE match; the other sees rowcount 0 and skips. A guarded leader's
claim also carries a fence: it matches only while that leader's own lock connection
(by backend pid) holds the key in pg_locks, so a leader frozen past its lease claims
nothing when it wakes. The countdown lives in that row, so a restart does not reset
it; ``scheduler_runs`` has a unique index on (job, slot) for leader runs as well.

Run now is a request, not a move of the schedule
================================================

An operator's run-now (admin API, page, CLI) sets ``run_requested_at`` on the job's
row and NOTIFYs, which makes the leader reload its rows at once; ``next_run_at`` is
never touched. The job timer claims the request at its next wake, before the job's next
slot (a slot that came due earlier goes first), with the slot claim's own UPDATE matched on
the request instead: it clears the request, takes the running lease and records one
run row marked ``manual`` whose slot is the request time, so the fence, the term and
the lease hold for it as for any slot. It fires at once, without jitter, and never
coalesces with a slot or takes one's place (the unique index is on (job, slot,
manual)). Run-now is refused while the lease holds; a request that finds the lease
taken when it is claimed is recorded ``skipped_overlap``, as a slot would be. Asking
again while a request is pending is the same request; a pause drops it.

A job never overlaps itself: the running lease
==============================================

A sync body runs in a thread, and a thread cannot be cancelled: on demotion (or after
a timeout) it runs on. Two things keep the next slot from starting beside it:

- *In the process*: the Runner, which lives as long as the scheduler, knows which jobs
  have a body running here; the job timer of any later leadership claims the job's slots
  as ``skipped_overlap`` until the thread ends.
- *In the cluster*: the claim that starts a run also takes the job row's *running
  lease* in the same UPDATE (``running_run_id``, ``running_since``, ``running_until``
  and the owner's ``running_pid`` / ``running_host``), and the run's row, inserted
  with it, carries the lease's end as well. The owning process renews it every third
  of ``LEASE_SECONDS`` while the body runs, even after it stopped leading, and clears
  the lease when the body ends. It renews it on the run's row (the job row's copy only
  while no other transaction holds that row), so a job row held by a foreign
  transaction keeps no renewal out, and a living body's lease never runs out. Any leader's claim
  that finds an unexpired lease records its slot as ``skipped_overlap``. A lease whose
  owner died (kill -9, a lost host) runs out after ``LEASE_SECONDS`` and the job fires
  again; an owner frozen (SIGSTOP) longer than that may resume a body beside a new
  run, the one overlap the lease cannot prevent. The lease is measured on the
  database server's clock (``clock_timestamp()`` plus ``LEASE_SECONDS``), the one clock
  every process shares, so hosts whose clocks disagree never take a live run for a
  dead one; a test's FakeClock measures it instead (``clock.lease_clock``). A claimed
  body begins only within its *start window* (start_window.py: two thirds of the
  lease, on the monotonic clock from before the claim); one that could begin only
  later (its process froze, its clock jumped) never runs, since its lease may already
  have been reaped and the job started elsewhere: its slot is recorded ``missed``
  (``job.start_too_late``). When a
  slot is due is read on that clock as well: on the system clock a scheduler runs on a
  ``ServerClock``, the host's clock plus the offset to the server's, measured at the
  start and every tick after, so a leader whose host clock is off fires no slot early
  or late.

On demotion an async body is cancelled at once and recorded ``cancelled``. A thread's
run stays ``running`` and gets its real outcome (``ok``, ``error``) when the thread
ends, logged as ``job.finished_after_demotion``.

Work that outlives its cancellation: one rule
=============================================

Not only a sync body runs in a thread: an async body or a service that does its
blocking work in ``asyncio.to_thread`` (or ``run_in_executor(None, ...)``) leaves that
thread running when a demotion cancels it. One rule covers them all: a run holds a
running lease from its start until its task *and every thread it started* ended,
renewed by the process's one renewer meanwhile (``batching.LeaseKeeper``; a keeper
thread once the event loop is gone), so no leader starts the same work beside it. The
scheduler knows a run's threads through the loop's default executor, which it makes an
``OwningExecutor`` (threads.py): what a run's task, or a task it started, submits there
is that run's. A task the run started (its loop's task factory sees it) is the run's
work as well, until it ends, even after the body returned: a task a body leaves
behind, and the threads it starts later, hold the lease as the body's own would.
Threads started otherwise (``threading.Thread``, an executor of the app's own, anyio's
worker threads) are not seen and hold nothing.

- *A job run* holds its running lease (above). An async body cancelled, timed out or
  returned while a thread or a task it started runs is recorded at once (``cancelled``,
  ...), but its run keeps the lease, and its job stays busy here, until they end
  (``job.outlived_by_threads``).
- *A service copy* holds a lease on a row of its own (``scheduler_service_runs``,
  named on its service's row in ``scheduler_services``, as a job run's is on its run
  row: a service row held elsewhere keeps no renewal out), which the leader takes
  before it starts the copy, fenced like a claim, and only while no other copy's lease
  holds. While one does (a stopped leader's copy whose thread runs
  on; a dead leader's copy until its lease runs out) the new leader waits, logged once
  as ``service.waiting_for_previous_copy``, and starts its copy the moment the lease is
  released (the release NOTIFYs the leader's lock connection) or has run out (it asks
  every tick and as the lease ends). A copy restarted after a crash waits for the
  crashed copy's threads too. After a kill -9 of the leader its services start again a
  lease later, not a grace later: nothing tells a dead copy that had a thread running
  from one that had none.

A per-worker run (``leader_only=False``) cannot hold the job row's lease, since every
worker runs the job at once; it holds a running lease on its own run row
(``scheduler_runs.running_until``), set as it starts, renewed and handed over to a
keeper thread exactly as a leader run's, and cleared by its outcome. It guards no
overlap (each worker's loop waits for its own run); it only tells whether the run's
worker still lives.

Across a shutdown the lease holds exactly as long as the run's work (its body, its
threads) runs in a living process:

- ``Scheduler.stop()`` returns after the grace with threads still running (job bodies,
  threads of cancelled async bodies and stopped service copies); the app's lifespan
  then waits for them (``Scheduler.wait_for_threads``, logged as
  ``scheduler.waiting_for_threads``), their leases renewed and their outcomes recorded
  (a copy's lease released) on the event loop. Without that wait uvicorn would end
  the process right after the lifespan (it raises the stop signal again) and kill the
  thread mid-way. A second SIGINT or SIGTERM ends the wait. The wait also covers every
  statement carried past its caller's cancel (``carried.Carried``: outcome writes,
  renewals, a copy's lease take the stop cut off, and its release if it landed), so
  none gives its pooled connection back to an engine the app already disposed.
- If the event loop ends before the thread anyway (that second signal, a host that
  tears the loop down: ``asyncio.run`` cancels every task, then waits for the threads,
  and so does Python at exit), the runner hands the run over to the thread's side
  (threads.py): a daemon keeper renews the lease on the sync engine until the run's
  threads ended, and the last of them records its real outcome
  (``job.finished_after_shutdown``; a service copy's: releases its lease) before the
  process can exit.
- A process killed (kill -9, or uvicorn's re-raised SIGTERM after that second signal)
  takes the body and its keeper with it: nothing renews the lease, which runs out after
  ``LEASE_SECONDS``; the run is reaped as ``abandoned`` and the job fires again.

The lease is also what "running" means to operators: a skipped or missed slot never
overwrites the ``running`` status of a job whose lease holds, and a lease that ran out
(its owner died) is *reaped*: the leader's tick, and the claim that takes the job
over, set its run and the job's status to ``abandoned`` (logged as ``job.abandoned``)
and clear the lease, so run-now is refused only while a lease holds. A per-worker run
whose own lease ran out is reaped to ``abandoned`` by the same leader tick and, with
no leader, by the job's next run on any worker; the job's status becomes
``abandoned`` too unless another of its runs ended after that lease ran out. A reaped
run whose body still ran (a frozen worker) records its real outcome when it ends. A
process never reaps a lease it renews itself (``Runner.renewing``): after a freeze of
the whole process its reaper may wake before its renewal, but the body runs there.

A job that goes away
====================

A promotion's registration settles which job rows of its schedule are *retired*
(registration.settle_retirement): a row whose id the promoted leader's registry lacks
(a job removed from the code, or renamed) gets ``retired_at``; a retired row whose id
it has again loses it, its history intact. It writes only when the rows the
registration read show a mark wrong, so a failover of an unchanged release pays no
statement for it. No registry claims a retired job, so it
fires no more; the admin listing hides it unless asked, run-now, pause and resume
refuse it (naming `jobs forget`), and an operator may forget it (its row and runs
deleted), never a live one.

One bad job stops nothing
=========================

A registration or claim of many jobs that fails while the database answers is made
again one job at a time, so each job's failure is its own. When a job's step fails
by its own fault (faults.py: the database answers and the row was not merely busy;
its trigger raises, its row refuses the claim, the job timer died), the job is
*broken* (broken.py, the one book): logged once as ``job.broken`` with its id,
recorded in ``scheduler_broken_jobs`` (shown in the admin job list and page, and by
``/health/scheduler``, which is then not ok), and retried every minute (retry.py's
BROKEN_JOB) until a registration or claim of it succeeds. Every other job keeps
firing. A failure while the database does not answer is passing: retried, never
called broken. A row another transaction holds is *busy*, not bad: a claim (and a
promotion's registration) locks only the rows no one else holds (SKIP LOCKED) and
leaves a held one out rather than wait on it (logged once as ``job.busy``), so it
holds up no other job whatever timeouts the database sets; the job is tried again
(retry.py's BUSY_ROW, at most a tick apart) and fires its slot once the row is free.
The leader also writes ``heartbeat_at`` on its leadership row every tick, so health
can tell a leader that holds the key but does not fire (a handover that never ends, a
stuck tick) from one that does; health also reads the job rows themselves and names
a job whose due slot waited unclaimed for longer than a tick plus the handover grace.

Per-worker jobs (``leader_only=False``) keep their slots per worker; see replicas.py
for what their row, pause and run-now mean.

A job's own commit: the leadership term
=======================================

The running lease keeps a new leader from starting the *same* job beside an old body;
it does not stop that body's writes. A thread (or an async body before its leader
notices the loss) can commit after a new leader promoted. So every leadership has a
term: before its first claim, a leader bumps ``scheduler_leadership.term`` on its lock
connection, in one statement that matches only while that connection holds the key
(``record_leadership``). Each claim returns the term it saw, which under the claim's
fence is its own leadership's, and the run's ``JobContext.term`` keeps it.

``await ctx.fence(session)`` (``ctx.fence_sync(session)`` in a thread job) takes the
term row FOR KEY SHARE inside the job's transaction: when the term moved it rolls the
transaction back and raises ``LeadershipLostError``; otherwise the transaction holds
the row until it ends, and the next promotion's bump (which locks the row FOR UPDATE)
waits for it, while the leader's heartbeat on that row does not. The promotion waits a
leader tick, then ends (pg_terminate_backend) the transactions that still hold the row:
their leader no longer holds the key, and may be hung (SIGSTOP) with them open. A
fenced commit of an old leadership thus lands before the next leadership's first
claim, or not at all. The fence covers only the transaction it runs in, and a
transaction held open past a promotion is ended, so fence the commits that move money,
just before they commit. Unguarded runs and the test kit's ``run_job``
take the term current at their claim (0 before any leader was recorded); a
per-replica job has none, and its fence raises SchedulerError.

The scheduler does not make jobs idempotent: a job's idempotency is a committed
column or a receiver-side UNIQUE, never this lock (see docs/DESIGN.md).
"""

from .clock import Clock, FakeClock, SystemClock
from .config import Role, SchedulerConfig
from .context import JobContext, ServiceContext
from .errors import (
    InvalidJobError,
    LeadershipLostError,
    ScheduleNameCollisionError,
    SchedulerError,
    TriggerArgumentError,
)
from .events import RunFinished
from .keys import InvalidScheduleNameError
from .lock_target import UnsafeLockConnectionError
from .scheduler import DuplicateScheduleError, Scheduler
from .triggers import Cron, Interval, Trigger, cron, every

__all__ = [
    "Clock",
    "Cron",
    "DuplicateScheduleError",
    "FakeClock",
    "Interval",
    "InvalidJobError",
    "InvalidScheduleNameError",
    "JobContext",
    "LeadershipLostError",
    "Role",
    "RunFinished",
    "ScheduleNameCollisionError",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerError",
    "ServiceContext",
    "SystemClock",
    "Trigger",
    "TriggerArgumentError",
    "UnsafeLockConnectionError",
    "cron",
    "every",
]
