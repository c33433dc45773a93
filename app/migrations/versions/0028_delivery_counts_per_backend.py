"""A delivery count is written by one backend only: ``outbox_delivered_minutes.shard``
becomes the writing backend's pid, where it was the pid modulo 16.

A count row is upserted, and so locked, by the statement that delivers, until its
transaction ends. Two backends whose pids shared a remainder shared the row: a drain's
outcome write waited for another transaction that had delivered in the same outbox and
minute (an operator's open psql session, another worker's drain), where an outcome
write never waits on a row another transaction holds (app/outbox/outcomes.py). One
backend runs one transaction at a time, so a row of its own pid is never held by
another. A minute has a row per backend that delivered in it: the surfaces sum an
hour's, a few thousand at most for the connections a deployment has.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-05
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTIONS = ("regent_count_inserted_deliveries", "regent_count_updated_deliveries")


_PER_BACKEND = "pg_backend_pid()"
_SIXTEEN = "pg_backend_pid() % 16"


def _count_per(shard: str, was: str) -> None:
    """Make both trigger functions (0027) write their counts to the shard ``shard``
    where they wrote to ``was`` (SQL expressions): each function's definition, as the
    server keeps it, with that one expression changed."""
    for name in _FUNCTIONS:
        op.execute(
            f"""
            DO $$
            DECLARE
                definition text := pg_get_functiondef('{name}'::regproc);
                was text := 'SELECT d.outbox, d.minute, {was}, sum(d.n)';
            BEGIN
                IF position(was IN definition) = 0 THEN
                    RAISE EXCEPTION '{name}() does not count per %: changed by hand?', '{was}';
                END IF;
                EXECUTE replace(definition, was, 'SELECT d.outbox, d.minute, {shard}, sum(d.n)');
            END
            $$
            """
        )


def upgrade() -> None:
    op.execute("ALTER TABLE outbox_delivered_minutes ALTER COLUMN shard TYPE integer")
    _count_per(_PER_BACKEND, was=_SIXTEEN)


def downgrade() -> None:
    # Waits out the transactions writing outbox_messages (a drain of this release, its
    # delivery counted but not committed) and holds new ones off until this commits, so
    # the fold below reads every count.
    op.execute("LOCK TABLE outbox_messages IN SHARE ROW EXCLUSIVE MODE")
    _count_per(_SIXTEEN, was=_PER_BACKEND)
    # Each pid's counts folded into the sixteen shards 0027 keeps, to fit its smallint.
    op.execute(
        "CREATE TEMPORARY TABLE per_backend ON COMMIT DROP AS"
        " SELECT outbox, minute, shard % 16 AS shard, sum(delivered) AS delivered"
        " FROM outbox_delivered_minutes GROUP BY 1, 2, 3"
    )
    op.execute("DELETE FROM outbox_delivered_minutes")
    op.execute("ALTER TABLE outbox_delivered_minutes ALTER COLUMN shard TYPE smallint")
    op.execute("INSERT INTO outbox_delivered_minutes SELECT * FROM per_backend")
