"""Schedules are namespaced: every scheduler row belongs to a schedule, by name.

Two apps on one database used to share one leader key and one job table, so the second
app's jobs never ran. Now each Scheduler has a name (``default`` unless given) and:

- ``scheduler_schedules``: each name that has started, with the pg_locks coordinates
  (classid, objid, objsubid) of its leader key (app/scheduler/keys.py), UNIQUE: two
  names whose keys hash alike cannot both be registered, so the second refuses to start.
  ``default`` is there from the start with the one-bigint key 911000001.
- ``schedule`` (text, default 'default') on scheduler_jobs, scheduler_runs,
  scheduler_broken_jobs and scheduler_leadership; every existing row belongs to
  ``default``. Primary keys, the runs' foreign key and the one-run-per-slot index
  include it, so one job id under two names is two jobs.
- scheduler_leadership holds one row per schedule (keyed by it) instead of the single
  row ``id = 1``, and ``job_ids``: the leader-only jobs the leader fires, so a standby
  of the same name with a job the leader lacks can say so.

Downgrade keeps the ``default`` schedule's rows and deletes the others'.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SCHEDULED = ("scheduler_jobs", "scheduler_runs", "scheduler_broken_jobs", "scheduler_leadership")
_ONE_PER_SLOT = "scheduler_runs_one_per_slot"
_RECENT = "scheduler_runs_job_recent"
_RUNS_FK = "scheduler_runs_job_id_fkey"


def _schedule_column() -> sa.Column[str]:
    return sa.Column("schedule", sa.Text, nullable=False, server_default="default")


def upgrade() -> None:
    op.create_table(
        "scheduler_schedules",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("key_classid", sa.BigInteger, nullable=False),
        sa.Column("key_objid", sa.BigInteger, nullable=False),
        sa.Column("key_objsubid", sa.Integer, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.UniqueConstraint(
            "key_classid", "key_objid", "key_objsubid", name="scheduler_schedules_one_per_key"
        ),
    )
    op.execute(
        "INSERT INTO scheduler_schedules (name, key_classid, key_objid, key_objsubid)"
        " VALUES ('default', 0, 911000001, 1)"
    )
    for table in _SCHEDULED:
        op.add_column(table, _schedule_column())

    op.drop_constraint(_RUNS_FK, "scheduler_runs", type_="foreignkey")
    op.drop_constraint("scheduler_jobs_pkey", "scheduler_jobs", type_="primary")
    op.create_primary_key("scheduler_jobs_pkey", "scheduler_jobs", ["schedule", "id"])
    op.create_foreign_key(
        _RUNS_FK,
        "scheduler_runs",
        "scheduler_jobs",
        ["schedule", "job_id"],
        ["schedule", "id"],
        ondelete="CASCADE",
    )
    op.drop_index(_ONE_PER_SLOT, table_name="scheduler_runs")
    op.create_index(
        _ONE_PER_SLOT,
        "scheduler_runs",
        ["schedule", "job_id", "slot", "manual"],
        unique=True,
        postgresql_where=sa.text("scope = 'leader'"),
    )
    op.drop_index(_RECENT, table_name="scheduler_runs")
    op.create_index(_RECENT, "scheduler_runs", ["schedule", "job_id", sa.text("id DESC")])

    op.drop_constraint("scheduler_broken_jobs_pkey", "scheduler_broken_jobs", type_="primary")
    op.create_primary_key(
        "scheduler_broken_jobs_pkey", "scheduler_broken_jobs", ["schedule", "job_id"]
    )

    op.drop_constraint("scheduler_leadership_pkey", "scheduler_leadership", type_="primary")
    op.drop_constraint("scheduler_leadership_one_row", "scheduler_leadership", type_="check")
    op.drop_column("scheduler_leadership", "id")
    op.create_primary_key("scheduler_leadership_pkey", "scheduler_leadership", ["schedule"])
    op.add_column(
        "scheduler_leadership",
        sa.Column("job_ids", sa.ARRAY(sa.Text), nullable=False, server_default="{}"),
    )


def downgrade() -> None:
    for table in ("scheduler_runs", "scheduler_broken_jobs", "scheduler_leadership"):
        op.execute(f"DELETE FROM {table} WHERE schedule <> 'default'")
    op.execute("DELETE FROM scheduler_jobs WHERE schedule <> 'default'")

    op.drop_column("scheduler_leadership", "job_ids")
    op.drop_constraint("scheduler_leadership_pkey", "scheduler_leadership", type_="primary")
    op.add_column(
        "scheduler_leadership",
        sa.Column("id", sa.Integer, nullable=False, server_default="1"),
    )
    op.alter_column("scheduler_leadership", "id", server_default=None)
    op.create_primary_key("scheduler_leadership_pkey", "scheduler_leadership", ["id"])
    op.create_check_constraint("scheduler_leadership_one_row", "scheduler_leadership", "id = 1")

    op.drop_constraint("scheduler_broken_jobs_pkey", "scheduler_broken_jobs", type_="primary")
    op.create_primary_key("scheduler_broken_jobs_pkey", "scheduler_broken_jobs", ["job_id"])

    op.drop_index(_RECENT, table_name="scheduler_runs")
    op.create_index(_RECENT, "scheduler_runs", ["job_id", sa.text("id DESC")])
    op.drop_index(_ONE_PER_SLOT, table_name="scheduler_runs")
    op.create_index(
        _ONE_PER_SLOT,
        "scheduler_runs",
        ["job_id", "slot", "manual"],
        unique=True,
        postgresql_where=sa.text("scope = 'leader'"),
    )
    op.drop_constraint(_RUNS_FK, "scheduler_runs", type_="foreignkey")
    op.drop_constraint("scheduler_jobs_pkey", "scheduler_jobs", type_="primary")
    op.create_primary_key("scheduler_jobs_pkey", "scheduler_jobs", ["id"])
    op.create_foreign_key(
        _RUNS_FK, "scheduler_runs", "scheduler_jobs", ["job_id"], ["id"], ondelete="CASCADE"
    )

    for table in _SCHEDULED:
        op.drop_column(table, "schedule")
    op.drop_table("scheduler_schedules")
