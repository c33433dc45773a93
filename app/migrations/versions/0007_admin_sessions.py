"""Admin sessions: a "not before" that sign-out bumps, and sign-in failures per client.

Both live in the database because every uvicorn worker must see them: a sign-out in one
worker revokes the cookie in all, and a client cannot multiply its guesses by the
number of workers.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "admin_sessions",
        sa.Column("id", sa.SmallInteger, primary_key=True),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name="admin_sessions_one_row"),
    )
    op.create_table(
        "admin_login_failures",
        sa.Column("client", sa.Text, primary_key=True),
        sa.Column("failures", sa.Integer, nullable=False),
        sa.Column("last_failure_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("admin_login_failures")
    op.drop_table("admin_sessions")
