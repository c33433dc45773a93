"""A job row that its schedule's leader no longer registers is retired.

A job removed from the code (or renamed) kept its row for good: listed with a next run
in the past, Run now offered, never fired. ``retired_at`` is set by a promotion on the
rows of its schedule that its registry lacks, and cleared by a promotion whose registry
has the job again (it comes back with its history). A retired job is hidden from the
default listing and can be forgotten (its row and history deleted).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("scheduler_jobs", sa.Column("retired_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("scheduler_jobs", "retired_at")
