"""Scheduler state: one row per job, one row per run.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_STATUSES = ("running", "ok", "error", "timeout", "cancelled", "skipped_overlap", "missed")


def upgrade() -> None:
    op.create_table(
        "scheduler_jobs",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("trigger", sa.Text, nullable=False),
        sa.Column("leader_only", sa.Boolean, nullable=False, server_default=sa.true()),
        # The next slot this job is due at; a fire claims it by moving it forward.
        sa.Column("next_run_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_started_at", sa.DateTime(timezone=True)),
        sa.Column("last_finished_at", sa.DateTime(timezone=True)),
        sa.Column("last_status", sa.Text),
        sa.Column("last_error", sa.Text),
        sa.Column("last_duration_ms", sa.Integer),
        sa.Column("last_success_at", sa.DateTime(timezone=True)),
        sa.Column("paused", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_table(
        "scheduler_runs",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column(
            "job_id",
            sa.Text,
            sa.ForeignKey("scheduler_jobs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        # 'leader' runs are claimed slots (at most one row per slot); 'replica' runs
        # happen on every worker.
        sa.Column("scope", sa.Text, nullable=False),
        sa.Column("slot", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("lateness_ms", sa.Integer, nullable=False),
        sa.Column("duration_ms", sa.Integer),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("error", sa.Text),
        sa.CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in RUN_STATUSES) + ")",
            name="scheduler_runs_status",
        ),
        sa.CheckConstraint("scope IN ('leader', 'replica')", name="scheduler_runs_scope"),
    )
    op.create_index("scheduler_runs_job_recent", "scheduler_runs", ["job_id", sa.text("id DESC")])
    # The database itself refuses a second run of one leader slot.
    op.create_index(
        "scheduler_runs_one_per_slot",
        "scheduler_runs",
        ["job_id", "slot"],
        unique=True,
        postgresql_where=sa.text("scope = 'leader'"),
    )


def downgrade() -> None:
    op.drop_table("scheduler_runs")
    op.drop_table("scheduler_jobs")
