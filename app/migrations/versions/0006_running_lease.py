"""The running lease: a job row says that one of its bodies still runs, where, and until when.

A thread cannot be cancelled, so a body can outlive the leadership of the process that
started it. The claim that starts a run sets ``running_run_id``, ``running_since``,
``running_until``, ``running_pid`` and ``running_host``; the owning process renews
``running_until`` while the body runs and clears the lease when it ends. A claim that
finds an unexpired lease records its slot as ``skipped_overlap`` instead of running it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (
    # The run holding the lease: the token its owner renews and clears by.
    ("running_run_id", sa.BigInteger),
    ("running_since", sa.DateTime(timezone=True)),
    ("running_until", sa.DateTime(timezone=True)),
    ("running_pid", sa.Integer),
    ("running_host", sa.Text),
)


def upgrade() -> None:
    for name, type_ in _COLUMNS:
        op.add_column("scheduler_jobs", sa.Column(name, type_))


def downgrade() -> None:
    for name, _ in reversed(_COLUMNS):
        op.drop_column("scheduler_jobs", name)
