"""The demo jobs' tables leave a database Regent's 0003 made them in, while all are empty.

Before this release Regent's revision 0003 created the demo's twelve tables in every
database it migrated, taking names (``subscriptions``, ``bookings``, ...) an
application's own migrations need. They are the demo's own migrations now. Here they are
dropped, all twelve at once, when every one of them is there and none holds a row: a
database that never ran the demo loses them; one whose demo tables hold rows keeps them
all (the demo's migration then finds them), and so does one where any of them is
missing or altered into something else's (a table of that name with rows). All or none,
so no half of the demo's schema is left behind.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

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


def upgrade() -> None:
    connection = op.get_bind()
    inspector = sa.inspect(connection)
    if not all(inspector.has_table(table) for table in DEMO_TABLES):
        return
    # Locked first, so no row arrives between the look and the drop.
    op.execute(f"LOCK TABLE {', '.join(DEMO_TABLES)} IN ACCESS EXCLUSIVE MODE")
    for table in DEMO_TABLES:
        if connection.execute(sa.text(f"SELECT EXISTS (SELECT 1 FROM {table})")).scalar():
            return
    for table in DEMO_TABLES:
        op.drop_table(table)


def downgrade() -> None:
    """Nothing: below 0025 Regent's chain makes no demo table either (0003 is empty)."""
