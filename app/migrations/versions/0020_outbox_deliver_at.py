"""Delayed outbox messages: the moment a message was enqueued to be delivered at.

``deliver_at`` is set by ``enqueue(at=...)`` or ``enqueue(delay=...)`` and NULL for a
message due at once; a reset clears it. A pending row whose ``deliver_at`` is still
ahead is *scheduled* (the admin page, API and CLI count it apart from pending), and the
oldest pending age counts from it rather than from ``created_at``, so a message
delayed by a week is not a week late the moment it falls due. ``next_attempt_at``
still says when the drain may claim the row; the drain reads nothing else. Adding a
nullable column rewrites no row.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("outbox_messages", sa.Column("deliver_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("outbox_messages", "deliver_at")
