"""The test kit lends each test a database at head with empty tables; a database given
back is wiped and lent again only when nothing tells it from a fresh clone."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import make_url

from app.testing import TestServer


def _oid(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _fill(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_messages"
            " (outbox, key, payload, next_attempt_at, created_at, updated_at)"
            " VALUES ('o', 'k', '{}', now(), now(), now())"
        )
        conn.execute("SELECT nextval('scheduler_runs_id_seq')")


def test_a_database_given_back_is_lent_again_with_empty_tables_and_restarted_sequences(
    pg_server: TestServer,
) -> None:
    url = pg_server.create_database()
    _fill(url)
    given_back = _oid(url)
    pg_server.release_database(url)

    again = pg_server.create_database()
    try:
        assert _oid(again) == given_back
        with psycopg.connect(again) as conn:
            assert conn.execute("SELECT count(*) FROM outbox_messages").fetchone() == (0,)
            assert conn.execute("SELECT nextval('scheduler_runs_id_seq')").fetchone() == (1,)
            versions = conn.execute("SELECT count(*) FROM regent_alembic_version").fetchone()
            assert versions == (1,)
    finally:
        pg_server.release_database(again)


def test_a_database_given_back_answers_under_its_old_name_no_more(
    pg_server: TestServer,
) -> None:
    url = pg_server.create_database()
    left_open = psycopg.connect(url)
    pg_server.release_database(url)
    assert left_open.closed or left_open.broken or _ended(left_open)
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(url).close()
    left_open.close()


def _ended(conn: psycopg.Connection[tuple[object, ...]]) -> bool:
    try:
        conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return True
    return False


@pytest.mark.parametrize(
    "change",
    [
        "CREATE TABLE a_tests_own (id int)",
        "ALTER TABLE outbox_messages ADD COLUMN note text",
        "CREATE INDEX a_tests_index ON outbox_messages (next_attempt_at, key)",
        "UPDATE regent_alembic_version SET version_num = '0001'",
        "ALTER DATABASE {database} SET lock_timeout = '200ms'",
    ],
    ids=["table", "column", "index", "version", "database-setting"],
)
def test_a_database_changed_beyond_its_rows_is_dropped_not_lent_again(
    pg_server: TestServer, change: str
) -> None:
    url = pg_server.create_database()
    changed = _oid(url)
    with psycopg.connect(url, autocommit=True) as conn:
        database = sql.Identifier(str(make_url(url).database))
        conn.execute(sql.SQL(change).format(database=database))
    pg_server.release_database(url)

    with psycopg.connect(pg_server.admin_url) as conn:
        kept = conn.execute("SELECT count(*) FROM pg_database WHERE oid = %s", (changed,))
        assert kept.fetchone() == (0,)
