"""Leadership records its services; each outbox name belongs to one schedule.

A standby of the same schedule name compares its own leader-only jobs with the
``job_ids`` its leader recorded (migration 0014), so a job the leader lacks is reported
(``scheduler.jobs_not_led``, /health/scheduler 503). A service (a long-running
consumer that runs only on the leader) the leader lacks ran nowhere unreported. Now
``service_ids`` holds the ids of the services the leader runs; NULL for a leadership
recorded by a release that did not record them (nothing is known, nothing reported).

``outbox_schedules``: the schedule each outbox name is drained by. Outbox rows are
per database, by outbox name: two apps of different schedule names, each with an
``sms`` outbox, would drain each other's rows (each with its own deliver). The first
schedule to start with an outbox claims its name here; an app of another schedule that
has an outbox of that name refuses to start (OutboxNameTakenError). Empty at first:
an outbox is claimed by the first start after the upgrade.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "scheduler_leadership", sa.Column("service_ids", sa.ARRAY(sa.Text), nullable=True)
    )
    op.create_table(
        "outbox_schedules",
        sa.Column("outbox", sa.Text, primary_key=True),
        sa.Column("schedule", sa.Text, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )


def downgrade() -> None:
    op.drop_table("outbox_schedules")
    op.drop_column("scheduler_leadership", "service_ids")
