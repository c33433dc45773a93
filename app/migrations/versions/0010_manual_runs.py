"""Manual runs: the slots an operator asked for with run-now.

Run-now moves a job's next slot to now and the leader fires it through the usual
claim, so the run row alone cannot tell a manual run from a scheduled one. This table
keeps (job, slot) of each request; a leader run of that slot (at most one, by the
one-run-per-slot index) is the manual run, and history reads the mark from here.

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
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


def downgrade() -> None:
    op.drop_table("scheduler_manual_runs")
