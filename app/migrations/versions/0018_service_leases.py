"""A service copy holds a running lease on its service's row, as a job run on its job's.

A service that does its blocking work in ``asyncio.to_thread`` is cancelled on a
step-down while its thread runs on; the next leader started its own copy after the
handover grace, beside it. ``scheduler_services`` holds one row per (schedule,
service): the copy that runs holds its running lease (``running_run_id``, its token,
drawn from the run ids' sequence, ``running_since``, ``running_until`` and the owner
``running_pid`` / ``running_host``) from its start until its task and every thread it
started ended, renewed meanwhile; a leader starts a copy only while no other copy's
lease holds. Empty at first: a row is written by the first copy that starts.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_services",
        sa.Column("schedule", sa.Text, primary_key=True),
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("running_run_id", sa.BigInteger),
        sa.Column("running_since", sa.DateTime(timezone=True)),
        sa.Column("running_until", sa.DateTime(timezone=True)),
        sa.Column("running_pid", sa.Integer),
        sa.Column("running_host", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("scheduler_services")
