"""The leadership term: a counter every promotion moves, which a job's commit is fenced by.

A body can outlive its leader's lock (a thread cannot be cancelled), so a commit of a
stale leadership could land after a new leader promoted. Each promotion bumps
``scheduler_leadership.term`` on its lock connection while it holds the key; a run
keeps the term its claim saw, and ``ctx.fence(session)`` takes the row FOR SHARE in
the job's transaction and fails when the term moved. The bump takes the row lock, so
a promotion waits for fenced transactions under way. An existing row starts at 0.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "scheduler_leadership",
        sa.Column("term", sa.BigInteger, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("scheduler_leadership", "term")
