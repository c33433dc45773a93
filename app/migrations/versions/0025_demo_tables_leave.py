"""The demo jobs' tables leave a database Regent's 0003 made them in, while all are empty.

Before this release Regent's revision 0003 created the demo's twelve tables in every
database it migrated, taking names (``subscriptions``, ``bookings``, ...) an
application's own migrations need. They are the demo's own migrations now (this
repository's ``migrations/``, which marks its tables with a comment). Here they are
dropped, all twelve at once or none, when every one of them is there, none carries the
demo migration's mark, none holds a row, no other object depends on them (a view of
the user's), and no session is using them: so a database that never ran the demo loses
them, and anything that may be someone's keeps them, untouched. Nothing here waits on a
lock: tables in use are in use by someone, and stay.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.exc import DBAPIError

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Children before parents: the order the foreign keys let them go.
DEMO_TABLES = (
    "processed_updates",
    "update_offsets",
    "report_stats",
    "tracking_events",
    "credit_reservations",
    "subscription_charges",
    "subscriptions",
    "credit_grants",
    "journal_entries",
    "standing_order_templates",
    "bookings",
    "workspaces",
)
# The comment the demo's own migration puts on its tables (migrations/ at the root).
DEMO_MARK = "the demo jobs' table (this repository's migrations/)"
# lock_not_available (a session uses a table), dependent_objects_still_exist.
_IN_USE = frozenset({"55P03", "2BP01"})


def _holds_a_row(connection: sa.Connection) -> bool:
    return any(
        connection.execute(sa.text(f"SELECT EXISTS (SELECT 1 FROM {table})")).scalar()
        for table in DEMO_TABLES
    )


def _sqlstate(exc: DBAPIError) -> str | None:
    for error in (exc.orig, getattr(exc.orig, "__cause__", None)):
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if state:
            return str(state)
    return None


def upgrade() -> None:
    connection = op.get_bind()
    inspector = sa.inspect(connection)
    if not all(inspector.has_table(table) for table in DEMO_TABLES):
        return
    marked = connection.execute(
        sa.text("SELECT obj_description('workspaces'::regclass, 'pg_class') = :mark"),
        {"mark": DEMO_MARK},
    ).scalar()
    # Looked at first without a lock: a live demo's tables hold rows, and stay unlocked.
    if marked or _holds_a_row(connection):
        return
    attempt = connection.begin_nested()
    try:
        connection.execute(
            sa.text(f"LOCK TABLE {', '.join(DEMO_TABLES)} IN ACCESS EXCLUSIVE MODE NOWAIT")
        )
        if _holds_a_row(connection):
            attempt.rollback()
            return
        for table in DEMO_TABLES:
            connection.execute(sa.text(f"DROP TABLE {table}"))
    except DBAPIError as exc:
        if _sqlstate(exc) not in _IN_USE:
            raise
        attempt.rollback()
        return
    attempt.commit()


def downgrade() -> None:
    """Nothing: below 0025 Regent's chain makes no demo table either (0003 is empty)."""
