"""Outbox: messages written in the caller's transaction, and each outbox's last drain.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "outbox_messages",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("outbox", sa.Text, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("payload", postgresql.JSONB, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="pending"),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        # The drain that holds the row's delivery lease, so a late outcome from a
        # drain whose lease lapsed cannot overwrite the current one.
        sa.Column("claimed_by", postgresql.UUID),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True)),
        sa.UniqueConstraint("outbox", "key", name="outbox_messages_outbox_key"),
        sa.CheckConstraint(
            "status IN ('pending', 'delivered', 'stuck')", name="outbox_messages_status"
        ),
    )
    # Serves the drain's due-pending query and nothing else: delivered rows leave it.
    op.create_index(
        "outbox_messages_due",
        "outbox_messages",
        ["outbox", "next_attempt_at", "id"],
        postgresql_where=sa.text("status = 'pending'"),
    )
    op.create_index(
        "outbox_messages_stuck",
        "outbox_messages",
        ["outbox", "id"],
        postgresql_where=sa.text("status = 'stuck'"),
    )
    op.create_table(
        "outbox_drains",
        sa.Column("outbox", sa.Text, primary_key=True),
        sa.Column("last_drain_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("delivered", sa.Integer, nullable=False),
        sa.Column("retried", sa.Integer, nullable=False),
        sa.Column("stuck", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("outbox_drains")
    op.drop_table("outbox_messages")
