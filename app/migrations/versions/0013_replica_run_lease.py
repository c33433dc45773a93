"""A per-worker run's running lease, on its own run row.

A per-worker run (``scope = 'replica'``: every worker runs the job at once) cannot
hold the job row's running lease, so a run whose worker died (kill -9) stayed
``running`` for good. Now:

- ``scheduler_runs.running_until``: set when a per-worker run starts, renewed by its
  worker while the body runs (as the job row's lease of a leader run is), cleared by
  the run's outcome. A run whose lease passed is reaped to ``abandoned``.
- A partial index on it: the reaper looks only at runs that hold a lease, never at
  the whole history.
- Per-worker runs left ``running`` by the code before this revision have no lease to
  tell whether their worker lives: they get one that has passed, so the next reap
  marks them ``abandoned``; one whose worker still runs it records its real outcome
  when it ends, as a reaped run does.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "scheduler_runs_running_until"


def upgrade() -> None:
    op.add_column("scheduler_runs", sa.Column("running_until", sa.DateTime(timezone=True)))
    op.create_index(
        _INDEX,
        "scheduler_runs",
        ["running_until"],
        postgresql_where=sa.text("running_until IS NOT NULL"),
    )
    op.execute(
        "UPDATE scheduler_runs SET running_until = now()"
        " WHERE scope = 'replica' AND status = 'running'"
    )


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="scheduler_runs")
    op.drop_column("scheduler_runs", "running_until")
