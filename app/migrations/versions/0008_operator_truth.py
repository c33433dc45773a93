"""Operator truth: broken jobs, abandoned runs, jitter apart from lateness, a firing leader.

- ``scheduler_broken_jobs``: a job whose row or next slot the leader cannot handle
  (its trigger raises, its row refuses the claim). Kept apart from ``scheduler_jobs``
  because the job's own row may be what cannot be written; no foreign key, since a
  broken job may have no row at all.
- ``scheduler_runs.status`` may be ``abandoned``: a run whose owner died, reaped once
  its running lease passed.
- ``scheduler_runs.jitter_ms``: the jitter drawn for the run; ``lateness_ms`` is
  measured from the jittered fire time, so jitter is no longer reported as lateness.
- ``scheduler_leadership.heartbeat_at``: written by the leader every tick while all its
  job loops run; health reads a leader that does not fire (handover that never ends,
  a dead job loop) as not ok.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OLD_STATUSES = ("running", "ok", "error", "timeout", "cancelled", "skipped_overlap", "missed")
_NEW_STATUSES = (*_OLD_STATUSES, "abandoned")


def _status_check(statuses: tuple[str, ...]) -> None:
    op.drop_constraint("scheduler_runs_status", "scheduler_runs", type_="check")
    op.create_check_constraint(
        "scheduler_runs_status",
        "scheduler_runs",
        "status IN (" + ", ".join(f"'{status}'" for status in statuses) + ")",
    )


def upgrade() -> None:
    op.create_table(
        "scheduler_broken_jobs",
        sa.Column("job_id", sa.Text, primary_key=True),
        sa.Column("error", sa.Text, nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
    )
    _status_check(_NEW_STATUSES)
    op.add_column(
        "scheduler_runs",
        sa.Column("jitter_ms", sa.BigInteger, nullable=False, server_default="0"),
    )
    op.add_column("scheduler_leadership", sa.Column("heartbeat_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("scheduler_leadership", "heartbeat_at")
    op.drop_column("scheduler_runs", "jitter_ms")
    op.execute("UPDATE scheduler_runs SET status = 'cancelled' WHERE status = 'abandoned'")
    _status_check(_OLD_STATUSES)
    op.drop_table("scheduler_broken_jobs")
