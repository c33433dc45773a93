"""A service copy holds its running lease on a row of its own, as a job run does.

The lease was on the service's row in ``scheduler_services``, which an operator can
hold (``SELECT ... FOR UPDATE`` in a psql session left open): the copy's renewals were
kept out, its lease ran out while it ran, and the next leader started a second copy
beside it. ``scheduler_service_runs`` holds one row per copy that holds a lease (its
token ``id``, drawn from the run ids' sequence, and ``running_until``), renewed there;
the service's row only names the holder (``running_run_id``, ``running_since``,
``running_pid``, ``running_host``). Leases held at the upgrade move to the new rows.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "scheduler_service_runs",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=False),
        sa.Column("schedule", sa.Text, nullable=False),
        sa.Column("service_id", sa.Text, nullable=False),
        sa.Column("running_until", sa.DateTime(timezone=True)),
    )
    op.execute(
        "INSERT INTO scheduler_service_runs (id, schedule, service_id, running_until)"
        " SELECT running_run_id, schedule, id, running_until FROM scheduler_services"
        " WHERE running_run_id IS NOT NULL"
    )
    op.drop_column("scheduler_services", "running_until")


def downgrade() -> None:
    op.add_column("scheduler_services", sa.Column("running_until", sa.DateTime(timezone=True)))
    op.execute(
        "UPDATE scheduler_services s SET running_until = r.running_until"
        " FROM scheduler_service_runs r WHERE r.id = s.running_run_id"
    )
    op.drop_table("scheduler_service_runs")
