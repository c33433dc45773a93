"""Forgotten sign-in failure counts found through an index: ``admin_login_failures_age``
on ``last_failure_at``. Every wrong token deletes the counts nobody touched for a day
(app/admin/throttle.py); without the index that DELETE read the whole table, which grows
with every client address that ever sent a wrong token (a local client may send from
any of 127.0.0.0/8's sixteen million).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "admin_login_failures_age"


def upgrade() -> None:
    op.create_index(_INDEX, "admin_login_failures", ["last_failure_at"])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="admin_login_failures")
