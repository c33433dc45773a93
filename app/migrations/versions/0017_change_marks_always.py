"""The change marks of job rows fire in every session, whatever its replication role.

An ordinary trigger does not fire in a session with ``session_replication_role =
replica``: the apply worker of logical replication runs so, and so does a data-fix
script that sets it to skip foreign-key checks. A pause or run-now written there left
the row's change mark (0016) where it was, and the leader's tick, which reads only
the rows whose mark moved, never saw it. ``ENABLE ALWAYS`` makes both marks fire in
every session; the registration's own inserts are still left unmarked by its
transaction setting (``regent.registering``), which the role does not touch.

A data-only restore with ``--disable-triggers`` disables the table's triggers outright
(``ALTER TABLE ... DISABLE TRIGGER ALL``): its rows are not marked, and its ``ENABLE
TRIGGER ALL`` afterwards leaves both marks firing in ordinary sessions only. Restore
job rows with the scheduler stopped (a promotion reads every row), then run this
upgrade's two statements again (see docs/DESIGN.md).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MARKS = ("scheduler_jobs_mark_change", "scheduler_jobs_mark_insert")


def upgrade() -> None:
    for trigger in _MARKS:
        op.execute(f"ALTER TABLE scheduler_jobs ENABLE ALWAYS TRIGGER {trigger}")


def downgrade() -> None:
    for trigger in _MARKS:
        op.execute(f"ALTER TABLE scheduler_jobs ENABLE TRIGGER {trigger}")
