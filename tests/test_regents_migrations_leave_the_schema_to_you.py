"""Regent's migrations create Regent's tables only (``scheduler_*``, ``outbox_*``,
``admin_*``, ``regent_*``): every other name is the application's. The demo jobs' tables
are this repository's own migrations (``migrations/``), where a user's go; a database an
older Regent migrated loses the demo's tables while they are empty, and a revision of
one's own that fails is named as such, not blamed on DATABASE_URL."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from alembic import command

from app.db import MigrationFailedError, alembic_config, migrate
from app.user_migrations import UserMigrations

REGENT_TABLE_PREFIXES = ("scheduler_", "outbox_", "admin_", "regent_")

# What Regent's revision 0003 once created in every database, for the demo jobs.
DEMO_TABLES = frozenset(
    {
        "workspaces",
        "bookings",
        "standing_order_templates",
        "journal_entries",
        "credit_grants",
        "subscriptions",
        "subscription_charges",
        "credit_reservations",
        "tracking_events",
        "report_stats",
        "update_offsets",
        "processed_updates",
    }
)

REPOSITORY_MIGRATIONS = UserMigrations(Path(__file__).resolve().parent.parent / "migrations")


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {name for (name,) in rows}


def _execute(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.encode())


def _own_subscriptions(project: Path) -> UserMigrations:
    """A user's project whose first revision creates a table named ``subscriptions``."""
    users = UserMigrations(project / "migrations")
    path = users.revision("subscriptions")
    path.write_text(
        path.read_text().replace(
            "def upgrade() -> None:\n    pass\n",
            "def upgrade() -> None:\n"
            '    op.execute("CREATE TABLE subscriptions (id bigint PRIMARY KEY, plan text)")\n',
            1,
        )
    )
    return users


def _as_made_by_an_older_regent(url: str) -> None:
    """Put the database where a Regent before 0025 left it: the demo's tables in it,
    Regent's revision 0024."""
    migrate(url, REPOSITORY_MIGRATIONS)
    _execute(
        url,
        "DROP TABLE alembic_version",
        "UPDATE regent_alembic_version SET version_num = '0024'",
        # What the revisions after 0024 made, so migrating from 0024 meets none of it.
        "DROP INDEX admin_login_failures_age",
        "DROP FUNCTION regent_count_inserted_deliveries() CASCADE",
        "DROP FUNCTION regent_count_updated_deliveries() CASCADE",
        "DROP TABLE outbox_delivered_minutes",
        # Regent's 0003 left no comment; the demo's own migration marks its tables.
        *(f"COMMENT ON TABLE {table} IS NULL" for table in DEMO_TABLES),
    )


def test_regents_migrations_create_only_tables_named_as_regents(empty_database_url: str) -> None:
    migrate(empty_database_url)

    tables = _tables(empty_database_url)
    assert tables, "nothing migrated"
    assert {name for name in tables if not name.startswith(REGENT_TABLE_PREFIXES)} == set()


def test_a_users_own_subscriptions_table_migrates_beside_regents(
    empty_database_url: str, user_project: Path
) -> None:
    migrate(empty_database_url, _own_subscriptions(user_project))

    assert "subscriptions" in _tables(empty_database_url)


def test_the_repositorys_own_migrations_hold_the_demos_tables(empty_database_url: str) -> None:
    migrate(empty_database_url, REPOSITORY_MIGRATIONS)

    assert _tables(empty_database_url) >= DEMO_TABLES


def test_a_database_an_older_regent_migrated_loses_the_demos_empty_tables(
    empty_database_url: str, user_project: Path
) -> None:
    _as_made_by_an_older_regent(empty_database_url)

    migrate(empty_database_url, _own_subscriptions(user_project))

    tables = _tables(empty_database_url)
    assert tables & DEMO_TABLES == {"subscriptions"}


def test_a_database_an_older_regent_migrated_keeps_the_demos_tables_holding_rows(
    empty_database_url: str,
) -> None:
    _as_made_by_an_older_regent(empty_database_url)
    _execute(empty_database_url, "INSERT INTO workspaces (name) VALUES ('kept')")

    migrate(empty_database_url, REPOSITORY_MIGRATIONS)

    assert _tables(empty_database_url) >= DEMO_TABLES
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT name FROM workspaces").fetchall() == [("kept",)]


def test_a_revision_of_ones_own_that_fails_is_named_not_blamed_on_the_database_url(
    empty_database_url: str, user_project: Path
) -> None:
    users = _own_subscriptions(user_project)
    _execute(empty_database_url, "CREATE TABLE subscriptions (id bigint)")

    with pytest.raises(MigrationFailedError) as failed:
        migrate(empty_database_url, users)

    message = str(failed.value)
    assert str(users.directory) in message
    assert "DuplicateTable" in message
    assert "DATABASE_URL" not in message


def test_a_database_an_older_regent_migrated_keeps_empty_demo_tables_something_depends_on(
    empty_database_url: str,
) -> None:
    _as_made_by_an_older_regent(empty_database_url)
    _execute(empty_database_url, "CREATE VIEW upcoming AS SELECT * FROM bookings")

    migrate(empty_database_url, REPOSITORY_MIGRATIONS)

    assert _tables(empty_database_url) >= DEMO_TABLES


def test_the_demos_own_tables_outlive_a_downgrade_and_upgrade_of_regents_chain(
    empty_database_url: str,
) -> None:
    migrate(empty_database_url, REPOSITORY_MIGRATIONS)
    command.downgrade(alembic_config(empty_database_url), "0024")

    migrate(empty_database_url, REPOSITORY_MIGRATIONS)

    assert _tables(empty_database_url) >= DEMO_TABLES


def test_a_database_an_older_regent_migrated_does_not_wait_on_a_reader_of_a_demo_table(
    empty_database_url: str,
) -> None:
    _as_made_by_an_older_regent(empty_database_url)
    with psycopg.connect(empty_database_url) as reader, ThreadPoolExecutor(1) as pool:
        reader.execute("SELECT * FROM bookings")  # its transaction stays open
        migrating = pool.submit(migrate, empty_database_url, REPOSITORY_MIGRATIONS)

        migrating.result(timeout=30)

    assert _tables(empty_database_url) >= DEMO_TABLES
