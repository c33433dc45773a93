"""Alembic environment of Regent's own migrations (run through app/migration_env.py,
under the migration lock). Regent's revision is kept in its own table
(REGENT_VERSION_TABLE), never in the default alembic_version, which belongs to the
application's own migrations.
"""

from alembic import context
from sqlalchemy import Connection, text

from app.db import REGENT_VERSION_TABLE
from app.migration_env import run_online

# A Regent from before its own version table kept its revision in alembic_version: the
# row is Regent's when it names one of Regent's revisions and Regent's tables exist.
_OLD_VERSION = text(
    "SELECT version_num FROM alembic_version"
    " WHERE to_regclass('scheduler_jobs') IS NOT NULL AND version_num = ANY(:ours)"
)


def _move_an_older_regents_version(connection: Connection) -> None:
    """Move Regent's revision out of alembic_version into its own table (dropping
    alembic_version when nothing else is left in it), so that a database made by an
    older Regent needs no step by hand. Runs under the migration lock."""
    exists = "SELECT to_regclass(:table) IS NOT NULL"
    if connection.scalar(text(exists), {"table": REGENT_VERSION_TABLE}):
        return
    if not connection.scalar(text(exists), {"table": "alembic_version"}):
        return
    ours = [script.revision for script in context.script.walk_revisions()]
    version = connection.scalar(_OLD_VERSION, {"ours": ours})
    if version is None:
        return
    connection.execute(
        text(f"CREATE TABLE {REGENT_VERSION_TABLE} (version_num varchar(32) NOT NULL PRIMARY KEY)")
    )
    connection.execute(
        text(f"INSERT INTO {REGENT_VERSION_TABLE} VALUES (:version)"), {"version": version}
    )
    connection.execute(
        text("DELETE FROM alembic_version WHERE version_num = :version"), {"version": version}
    )
    if not connection.scalar(text("SELECT EXISTS (SELECT 1 FROM alembic_version)")):
        connection.execute(text("DROP TABLE alembic_version"))


run_online(version_table=REGENT_VERSION_TABLE, before=_move_an_older_regents_version)
