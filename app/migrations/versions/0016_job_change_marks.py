"""Change marks on job rows, so a leader's tick reads only the rows that changed.

A leader's tick looks for what other processes changed (a pause, a resume, a run-now
request, a slot moved): it read every job row, which with 10,000 jobs stalled the
leader every tick. Now:

- ``scheduler_jobs.changed_xid`` (xid8): the transaction that last changed the row's
  schedule state (``next_run_at``, ``paused``, ``run_requested_at``, ``trigger``,
  ``leader_only``), set by a trigger whoever writes it (the admin, the CLI, an
  operator's own SQL, an older release), and on every insert (a restore, a script that
  deletes and inserts the row again) but a leader's registration's: it holds what it
  wrote, and says so with the transaction setting ``regent.registering``.
- An index on (schedule, changed_xid) of the rows changed since inserted: a tick
  reads the rows changed by every transaction its previous read could not see
  (changed_xid at or above that read's snapshot xmin), committed since or under way
  then, without a scan of the table; a first boot's 10,000 inserts add no entry.
- A partial index on the running leases of job rows: the tick's reap looks only at
  the jobs that hold one, as it does for per-worker runs (0013).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHANGED = "scheduler_jobs_changed"
_LEASES = "scheduler_jobs_running_until"


def upgrade() -> None:
    # xid8 has no SQLAlchemy type. A constant default rewrites no row.
    op.execute("ALTER TABLE scheduler_jobs ADD COLUMN changed_xid xid8 NOT NULL DEFAULT '0'")
    op.execute(
        """
        CREATE FUNCTION scheduler_jobs_mark_change() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            NEW.changed_xid := pg_current_xact_id();
            RETURN NEW;
        END $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER scheduler_jobs_mark_change BEFORE UPDATE ON scheduler_jobs
        FOR EACH ROW WHEN (
            OLD.next_run_at IS DISTINCT FROM NEW.next_run_at
            OR OLD.paused IS DISTINCT FROM NEW.paused
            OR OLD.run_requested_at IS DISTINCT FROM NEW.run_requested_at
            OR OLD.trigger IS DISTINCT FROM NEW.trigger
            OR OLD.leader_only IS DISTINCT FROM NEW.leader_only)
        EXECUTE FUNCTION scheduler_jobs_mark_change()
        """
    )
    op.execute(
        """
        CREATE TRIGGER scheduler_jobs_mark_insert BEFORE INSERT ON scheduler_jobs
        FOR EACH ROW WHEN (current_setting('regent.registering', true) IS DISTINCT FROM 'on')
        EXECUTE FUNCTION scheduler_jobs_mark_change()
        """
    )
    op.create_index(
        _CHANGED,
        "scheduler_jobs",
        ["schedule", "changed_xid"],
        postgresql_where=sa.text("changed_xid <> '0'"),
    )
    op.create_index(
        _LEASES,
        "scheduler_jobs",
        ["schedule", "running_until"],
        postgresql_where=sa.text("running_until IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(_LEASES, table_name="scheduler_jobs")
    op.drop_index(_CHANGED, table_name="scheduler_jobs")
    op.execute("DROP TRIGGER scheduler_jobs_mark_insert ON scheduler_jobs")
    op.execute("DROP TRIGGER scheduler_jobs_mark_change ON scheduler_jobs")
    op.execute("DROP FUNCTION scheduler_jobs_mark_change()")
    op.drop_column("scheduler_jobs", "changed_xid")
