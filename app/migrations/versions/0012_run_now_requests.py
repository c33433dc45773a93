"""Run-now is a request beside the schedule, and a manual run says so on its run row.

Run-now used to move the job's ``next_run_at`` to now, so the leader fired it through
the slot claim: the schedule moved for good, the jitter delayed it, and a request that
raced a slot claim was lost. Now:

- ``scheduler_jobs.run_requested_at``: the moment an operator asked for a run (NULL: no
  request pending). The leader claims it in a conditional UPDATE of its own that clears
  it and takes the running lease as a slot claim does; ``next_run_at`` is untouched.
- ``scheduler_runs.manual``: the run was asked for by run-now; its slot is the request
  time. It replaces the side table ``scheduler_manual_runs`` of 0010, whose marks are
  carried over.
- The one-run-per-slot index covers (job, slot, manual): a manual run never takes the
  place of a scheduled slot that falls on the same instant, and each stays unique.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "scheduler_runs_one_per_slot"


def upgrade() -> None:
    op.add_column("scheduler_jobs", sa.Column("run_requested_at", sa.DateTime(timezone=True)))
    op.add_column(
        "scheduler_runs",
        sa.Column("manual", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.execute(
        """
        UPDATE scheduler_runs r SET manual = true
        FROM scheduler_manual_runs m
        WHERE r.scope = 'leader' AND r.job_id = m.job_id AND r.slot = m.slot
        """
    )
    op.drop_table("scheduler_manual_runs")
    op.drop_index(_INDEX, table_name="scheduler_runs")
    op.create_index(
        _INDEX,
        "scheduler_runs",
        ["job_id", "slot", "manual"],
        unique=True,
        postgresql_where=sa.text("scope = 'leader'"),
    )


def downgrade() -> None:
    op.create_table(
        "scheduler_manual_runs",
        sa.Column(
            "job_id",
            sa.Text,
            sa.ForeignKey("scheduler_jobs.id", ondelete="CASCADE"),
            primary_key=True,
        ),
        sa.Column("slot", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False),
    )
    # The old index allows one leader run per slot: a manual run that fell on the
    # instant of a scheduled slot cannot be kept beside it.
    op.execute(
        """
        DELETE FROM scheduler_runs m
        WHERE m.scope = 'leader' AND m.manual AND EXISTS (
            SELECT 1 FROM scheduler_runs s
            WHERE s.scope = 'leader' AND NOT s.manual AND s.job_id = m.job_id
                AND s.slot = m.slot)
        """
    )
    op.execute(
        """
        INSERT INTO scheduler_manual_runs (job_id, slot, requested_at)
        SELECT job_id, slot, slot FROM scheduler_runs WHERE scope = 'leader' AND manual
        """
    )
    # A pending request becomes what 0011's run-now did: the next slot moved to it.
    op.execute(
        """
        INSERT INTO scheduler_manual_runs (job_id, slot, requested_at)
        SELECT id, run_requested_at, run_requested_at FROM scheduler_jobs
        WHERE run_requested_at < next_run_at
        ON CONFLICT DO NOTHING
        """
    )
    op.execute(
        "UPDATE scheduler_jobs SET next_run_at = LEAST(next_run_at, run_requested_at)"
        " WHERE run_requested_at IS NOT NULL"
    )
    op.drop_index(_INDEX, table_name="scheduler_runs")
    op.create_index(
        _INDEX,
        "scheduler_runs",
        ["job_id", "slot"],
        unique=True,
        postgresql_where=sa.text("scope = 'leader'"),
    )
    op.drop_column("scheduler_runs", "manual")
    op.drop_column("scheduler_jobs", "run_requested_at")
