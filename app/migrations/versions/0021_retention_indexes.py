"""Retention reads only what it removes: an index for each of its two deletes.

- ``scheduler_runs_started`` on (schedule, started_at): a pass of the run-history
  prune walks a schedule's runs from the oldest start up to its cutoff and stops there,
  never through the kept history behind it.
- ``outbox_messages_delivered`` on (outbox, delivered_at), delivered rows only: the
  delivered-row prune walks an outbox's oldest deliveries up to its cutoff, and the
  operator surfaces count the deliveries of the last hour from it (a window, not a scan
  of every delivered row; app/operations/outboxes.py).

Built with a plain CREATE INDEX: on a table of millions of rows that blocks writes to it
for the seconds the build takes, once, during the upgrade.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_RUNS = "scheduler_runs_started"
_DELIVERED = "outbox_messages_delivered"


def upgrade() -> None:
    op.create_index(_RUNS, "scheduler_runs", ["schedule", "started_at"])
    op.create_index(
        _DELIVERED,
        "outbox_messages",
        ["outbox", "delivered_at"],
        postgresql_where=sa.text("status = 'delivered'"),
    )


def downgrade() -> None:
    op.drop_index(_DELIVERED, table_name="outbox_messages")
    op.drop_index(_RUNS, table_name="scheduler_runs")
