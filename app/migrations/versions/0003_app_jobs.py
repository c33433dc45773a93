"""Once the demo jobs' tables; now nothing.

This revision created the demo jobs' twelve tables (workspaces, bookings, subscriptions,
...) in every database Regent migrated, where they took names an application's own
tables need. They are the demo's own migrations now (this repository's ``migrations/``),
so a fresh database gets none of them from Regent; a database migrated before keeps
them until 0025, which drops them while all are empty.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from collections.abc import Sequence

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing: the demo's tables are the demo's migrations."""


def downgrade() -> None:
    """Nothing: upgrade made nothing."""
