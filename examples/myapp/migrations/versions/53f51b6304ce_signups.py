"""signups: the people who signed up, and when each was sent a welcome mail

Revision ID: 53f51b6304ce
Revises: (none)
Create Date: 2026-12-04 10:42:50.342692
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "53f51b6304ce"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "signups",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), primary_key=True),
        sa.Column("email", sa.Text, nullable=False),
        # Stamped in the transaction that queues the mail: a second run skips the row.
        sa.Column("welcomed_at", sa.DateTime(timezone=True)),
    )


def downgrade() -> None:
    op.drop_table("signups")
