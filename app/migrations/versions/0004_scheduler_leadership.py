"""Who leads, and since when: written by each leader at promotion, read by operators.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_leadership",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("host", sa.Text, nullable=False),
        sa.Column("backend_pid", sa.Integer, nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name="scheduler_leadership_one_row"),
    )


def downgrade() -> None:
    op.drop_table("scheduler_leadership")
