"""Alembic environment of Regent's own migrations (run through app/migration_env.py,
under the migration lock). Regent's revision is kept in its own table
(REGENT_VERSION_TABLE), never in the default alembic_version, which belongs to the
application's own migrations.
"""

from alembic import context
from sqlalchemy import Connection, text

from app.db import REGENT_VERSION_TABLE, MigrationFailedError
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
        _refuse_regents_tables_without_its_revision(connection)
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


def _refuse_regents_tables_without_its_revision(connection: Connection) -> None:
    """Raise MigrationFailedError when Regent's tables are here but alembic_version names
    none of Regent's revisions: an older Regent's database whose own revisions were added
    after Regent's in its one chain. Migrating it from nothing would fail on the first
    table; which of Regent's revisions it holds only its owner can tell."""
    if not connection.scalar(text("SELECT to_regclass('scheduler_jobs') IS NOT NULL")):
        return
    found = ", ".join(connection.scalars(text("SELECT version_num FROM alembic_version")))
    raise MigrationFailedError(
        f"this database has Regent's tables but no revision of Regent's recorded: "
        f"alembic_version holds {found or 'nothing'}, not one of Regent's (a revision "
        "of your own added after Regent's in one chain, by an older Regent?). Record the "
        f"revision of Regent's it is at in {REGENT_VERSION_TABLE} (CREATE TABLE "
        f"{REGENT_VERSION_TABLE} (version_num varchar(32) PRIMARY KEY); INSERT INTO "
        f"{REGENT_VERSION_TABLE} VALUES ('00NN')), move your revisions to your own "
        "migrations, then run migrate again"
    )


run_online(version_table=REGENT_VERSION_TABLE, before=_move_an_older_regents_version)
