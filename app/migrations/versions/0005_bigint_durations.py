"""Durations and counters as bigint: a slot 25 days late must still be recordable.

``scheduler_runs.lateness_ms`` was int4: a slot more than 24.8 days late made the
claim's history INSERT fail, which rolled the claim back, so the job never moved again.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WIDENED = (
    ("scheduler_runs", "lateness_ms"),
    ("scheduler_runs", "duration_ms"),
    ("scheduler_jobs", "last_duration_ms"),
    ("outbox_drains", "delivered"),
    ("outbox_drains", "retried"),
    ("outbox_drains", "stuck"),
)


def upgrade() -> None:
    for table, column in _WIDENED:
        op.alter_column(table, column, type_=sa.BigInteger, existing_type=sa.Integer)


def downgrade() -> None:
    for table, column in _WIDENED:
        op.alter_column(table, column, type_=sa.Integer, existing_type=sa.BigInteger)
