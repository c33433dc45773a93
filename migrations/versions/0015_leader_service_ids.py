"""The leadership row records the services its leader runs, beside its jobs.

A standby of the same schedule name compares its own leader-only jobs with the
``job_ids`` its leader recorded (migration 0014), so a job the leader lacks is reported
(``scheduler.jobs_not_led``, /health/scheduler 503). A service (a long-running
consumer that runs only on the leader) the leader lacks ran nowhere unreported. Now
``service_ids`` holds the ids of the services the leader runs; NULL for a leadership
recorded by a release that did not record them (nothing is known, nothing reported).

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


def downgrade() -> None:
    op.drop_column("scheduler_leadership", "service_ids")
