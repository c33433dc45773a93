"""A job's runs of one status read through an index: ``scheduler_runs_job_status`` on
(schedule, job_id, status, id DESC). The admin API's and page's ``?status=`` and the
CLI's ``jobs runs --status`` ask for a job's newest runs of a status (its errors, its
abandoned runs); through the (schedule, job_id, id DESC) index alone, a status the job
rarely has was found by reading its whole history (a month of a 1 s job: millions of
runs). Outcome updates already change an indexed column (``running_until``), so they
were never HOT: the index adds one entry per insert and per outcome, nothing more.

Built with a plain CREATE INDEX: on a table of millions of rows that blocks writes to it
for the seconds the build takes, once, during the upgrade.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "scheduler_runs_job_status"


def upgrade() -> None:
    op.create_index(_INDEX, "scheduler_runs", ["schedule", "job_id", "status", sa.text("id DESC")])


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="scheduler_runs")
