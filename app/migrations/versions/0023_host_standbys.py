"""The workers waiting behind their host's lock file, one row each, so that they are
counted as standbys.

A worker of a host whose lock file (app/scheduler/host_lock.py) another worker holds
opens no lock connection: it waits on the file and has no session waiting in
pg_advisory_lock, where the standbys are counted. ``scheduler_host_standbys`` holds
one row per such worker (schedule, host, pid) while it waits, with a lease
(``expires_at``, on the lease clock) that the worker renews every leader tick: a row
whose lease ran out belongs to a worker that died or hangs, and is not counted. Empty
at first.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_host_standbys",
        sa.Column("schedule", sa.Text, primary_key=True),
        sa.Column("host", sa.Text, primary_key=True),
        sa.Column("pid", sa.Integer, primary_key=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_host_standbys")
