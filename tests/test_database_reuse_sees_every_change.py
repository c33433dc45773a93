"""A database given back is lent again only when nothing tells it from a fresh clone:
changes that live outside rows, columns and constraints (comments, rules, row-level
security, policies, large objects, sequence options, persistence, trigger state,
owners, column grants, statistics targets) get it dropped instead."""

from __future__ import annotations

import psycopg
import pytest

from app.testing import TestServer


@pytest.mark.parametrize(
    "change",
    [
        "COMMENT ON TABLE outbox_messages IS 'left by a test'",
        "CREATE RULE a_tests_rule AS ON INSERT TO outbox_messages DO INSTEAD NOTHING",
        "ALTER TABLE outbox_messages ENABLE ROW LEVEL SECURITY",
        "SELECT lo_create(4242)",
        "ALTER SEQUENCE scheduler_runs_id_seq INCREMENT BY 7",
        "ALTER TABLE outbox_messages SET UNLOGGED",
        "GRANT SELECT (key) ON outbox_messages TO PUBLIC",
        "ALTER TABLE outbox_messages ALTER COLUMN key SET STATISTICS 5",
        "ALTER TABLE outbox_messages OWNER TO pg_database_owner",
    ],
    ids=[
        "comment",
        "rule",
        "row-security",
        "large-object",
        "sequence-increment",
        "unlogged",
        "column-grant",
        "statistics-target",
        "owner",
    ],
)
def test_a_database_changed_outside_its_schema_text_is_dropped_not_lent_again(
    pg_server: TestServer, change: str
) -> None:
    url = pg_server.create_database()
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT oid FROM pg_database WHERE datname = current_database()"
        ).fetchone()
        assert row is not None
        conn.execute(change)
    pg_server.release_database(url)

    with psycopg.connect(pg_server.admin_url) as conn:
        kept = conn.execute("SELECT count(*) FROM pg_database WHERE oid = %s", (row[0],))
        assert kept.fetchone() == (0,)
