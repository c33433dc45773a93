"""The demo jobs' tables: the one behind each idempotency pattern of app/jobs.

This repository's own migrations, where a backend built on it keeps its tables
(`python -m app revision -m "..."` adds one after the head). Regent's migrations create
none of these: before Regent's revision 0025 its 0003 did, in every database; 0025 drops
them while all are empty, and keeps them (this revision then finds them) when any holds
rows.

Revision ID: 0264e06ae8b6
Revises: (none)
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0264e06ae8b6"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TS = sa.DateTime(timezone=True)
# The comment Regent's 0025 recognises (its DEMO_MARK), quotes doubled for SQL.
MARK = "the demo jobs'' table (this repository''s migrations/)"
TABLES = (
    "workspaces",
    "bookings",
    "standing_order_templates",
    "journal_entries",
    "credit_grants",
    "subscriptions",
    "subscription_charges",
    "credit_reservations",
    "tracking_events",
    "report_stats",
    "update_offsets",
    "processed_updates",
)


def _workspace() -> sa.Column[int]:
    return sa.Column(
        "workspace_id", sa.Integer, sa.ForeignKey("workspaces.id"), nullable=False, index=True
    )


def upgrade() -> None:
    if not sa.inspect(op.get_bind()).has_table("workspaces"):
        _create()
    # Marked as this chain's, so that Regent's 0025 leaves them alone whatever they hold
    # (a database Regent migrated before 0025 had them from Regent's 0003: now ours).
    for table in TABLES:
        op.execute(f"COMMENT ON TABLE {table} IS '{MARK}'")


def _create() -> None:
    op.create_table(
        "workspaces",
        sa.Column("id", sa.Integer, sa.Identity(), primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("credit_balance", sa.BigInteger, nullable=False, server_default="0"),
    )
    # Booking reminders: stamp columns, NULL until the SMS for that window is sent.
    op.create_table(
        "bookings",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        _workspace(),
        sa.Column("phone", sa.Text, nullable=False),
        sa.Column("starts_at", TS, nullable=False),
        sa.Column("reminder_24h_sent_at", TS),
        sa.Column("reminder_1h_sent_at", TS),
    )
    op.create_index("bookings_starts_at", "bookings", ["starts_at"])
    # Standing orders: advance-then-commit on next_due_date.
    op.create_table(
        "standing_order_templates",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        _workspace(),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
        sa.Column("interval_months", sa.Integer, nullable=False, server_default="1"),
        sa.Column("next_due_date", sa.Date, nullable=False),
    )
    op.create_table(
        "journal_entries",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        _workspace(),
        sa.Column("template_id", sa.BigInteger, sa.ForeignKey("standing_order_templates.id")),
        sa.Column("entry_date", sa.Date, nullable=False),
        sa.Column("description", sa.Text, nullable=False),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("template_id", "entry_date", name="journal_entries_one_per_due"),
    )
    # Credit grants: the grant and its outbox row commit together.
    op.create_table(
        "credit_grants",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        _workspace(),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("reference", sa.Text, nullable=False, unique=True),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )
    # Subscriptions: claim before send, with a reference.
    op.create_table(
        "subscriptions",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        _workspace(),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
        sa.Column("interval_days", sa.Integer, nullable=False, server_default="30"),
        sa.Column("next_charge_at", TS, nullable=False),
        sa.Column("pending_charge_ref", postgresql.UUID),
        sa.Column("pending_amount_cents", sa.BigInteger),
        sa.Column("claimed_at", TS),
    )
    op.create_table(
        "subscription_charges",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("subscription_id", sa.BigInteger, sa.ForeignKey("subscriptions.id")),
        sa.Column("reference", postgresql.UUID, nullable=False, unique=True),
        sa.Column("amount_cents", sa.BigInteger, nullable=False),
        sa.Column("status", sa.Text, nullable=False),
        sa.Column("provider_charge_id", sa.Text),
        sa.Column("recorded_at", TS, nullable=False),
    )
    # Stale reservation sweep: a conditional UPDATE on status.
    op.create_table(
        "credit_reservations",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        _workspace(),
        sa.Column("amount", sa.BigInteger, nullable=False),
        sa.Column("status", sa.Text, nullable=False, server_default="held"),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("settled_at", TS),
        sa.CheckConstraint(
            "status IN ('held', 'settled', 'refunded')", name="credit_reservations_status"
        ),
    )
    op.create_index(
        "credit_reservations_held",
        "credit_reservations",
        ["created_at"],
        postgresql_where=sa.text("status = 'held'"),
    )
    # Retention.
    op.create_table(
        "tracking_events",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        _workspace(),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("occurred_at", TS, nullable=False),
    )
    op.create_index("tracking_events_occurred_at", "tracking_events", ["occurred_at"])
    # Report warm: the aggregate GET /api/stats reads.
    op.create_table(
        "report_stats",
        sa.Column("workspace_id", sa.Integer, sa.ForeignKey("workspaces.id"), primary_key=True),
        sa.Column("events_30d", sa.BigInteger, nullable=False),
        sa.Column("upcoming_bookings", sa.BigInteger, nullable=False),
        sa.Column("computed_at", TS, nullable=False),
    )
    # Long-poll consumer: the offset and what it did, committed together.
    op.create_table(
        "update_offsets",
        sa.Column("source", sa.Text, primary_key=True),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "processed_updates",
        sa.Column("source", sa.Text, primary_key=True),
        sa.Column("update_id", sa.BigInteger, primary_key=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("processed_by_pid", sa.Integer, nullable=False),
        sa.Column("processed_at", TS, nullable=False),
    )


def downgrade() -> None:
    for table in reversed(TABLES):  # children first
        op.drop_table(table)
