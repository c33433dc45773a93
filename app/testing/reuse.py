"""Databases lent to tests and wiped for the next one, instead of one clone per test.

Cloning the template (CREATE DATABASE ... TEMPLATE) copies every catalog page, about
9 MB, and took most of a short test's time on two loaded cores (0.7-1.2 s against
40-90 ms for emptying the tables). A database given back is wiped and lent again only
when nothing can tell it from a fresh clone:

- no session is left on it: its sessions are ended, then it is renamed, so a process
  the test left behind cannot reconnect to it under the name it knew;
- its schema is the template's (``schema_fingerprint``: tables, columns, constraints,
  indexes, functions, triggers and whether they fire, types, rules, row-level security
  and policies, owners, column grants and statistics targets, sequence options,
  comments, large objects, the database's own settings); a test that created a table
  or ran ``ALTER DATABASE ... SET`` gets its database dropped instead;
- the tables the template has rows in (the migration version tables) still hold exactly
  those rows, and are kept; every other table that holds a row is emptied and every
  sequence that was read restarted.

Anything that fails along the way drops the database, as before.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable

import psycopg
from psycopg import sql

__all__ = ["DatabasePool"]

# Everything a test could change about a database's shape, in a stable order.
_SCHEMA_FINGERPRINT = """
WITH user_namespaces AS (
    SELECT oid, nspname FROM pg_namespace
    WHERE nspname NOT IN ('pg_catalog', 'information_schema')
      AND nspname NOT LIKE 'pg_toast%' AND nspname NOT LIKE 'pg_temp%'
)
SELECT line FROM (
    SELECT format('schema %s %s', nspname, nspacl) AS line FROM pg_namespace
    WHERE oid IN (SELECT oid FROM user_namespaces)
    UNION ALL
    SELECT format('relation %s.%s %s %s %s %s %s %s %s %s', n.nspname, c.relname,
                  c.relkind, c.reloptions, c.relacl, c.relpersistence, c.relrowsecurity,
                  c.relforcerowsecurity, c.relreplident, c.relowner)
    FROM pg_class c JOIN user_namespaces n ON n.oid = c.relnamespace
    UNION ALL
    SELECT format('column %s.%s %s %s %s %s %s %s %s', n.nspname, c.relname,
                  a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
                  a.attisdropped, pg_get_expr(d.adbin, d.adrelid), a.attacl,
                  a.attstattarget)
    FROM pg_attribute a
    JOIN pg_class c ON c.oid = a.attrelid
    JOIN user_namespaces n ON n.oid = c.relnamespace
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attnum > 0
    UNION ALL
    SELECT format('constraint %s.%s %s %s', n.nspname, c.conrelid::regclass, c.conname,
                  pg_get_constraintdef(c.oid))
    FROM pg_constraint c JOIN user_namespaces n ON n.oid = c.connamespace
    UNION ALL
    SELECT format('index %s', pg_get_indexdef(i.indexrelid))
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    JOIN user_namespaces n ON n.oid = c.relnamespace
    UNION ALL
    SELECT format('function %s.%s %s %s', n.nspname, p.proname,
                  pg_get_function_identity_arguments(p.oid), md5(p.prosrc))
    FROM pg_proc p JOIN user_namespaces n ON n.oid = p.pronamespace
    UNION ALL
    SELECT format('trigger %s %s', pg_get_triggerdef(t.oid), t.tgenabled)
    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
    JOIN user_namespaces n ON n.oid = c.relnamespace
    WHERE NOT t.tgisinternal
    UNION ALL
    SELECT format('type %s.%s %s', n.nspname, t.typname, t.typtype)
    FROM pg_type t JOIN user_namespaces n ON n.oid = t.typnamespace
    UNION ALL
    SELECT format('enum %s %s %s', e.enumtypid::regtype, e.enumsortorder, e.enumlabel)
    FROM pg_enum e
    UNION ALL
    SELECT format('view %s', pg_get_viewdef(c.oid))
    FROM pg_class c JOIN user_namespaces n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('v', 'm')
    UNION ALL
    SELECT format('extension %s %s', extname, extversion) FROM pg_extension
    UNION ALL
    SELECT format('setting %s %s', setrole, setconfig) FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
    UNION ALL
    SELECT format('sequence %s %s %s %s %s %s %s', seqrelid::regclass, seqtypid,
                  seqstart, seqincrement, seqmax, seqmin, seqcache, seqcycle)
    FROM pg_sequence
    UNION ALL
    SELECT format('rule %s', pg_get_ruledef(r.oid)) FROM pg_rewrite r
    JOIN pg_class c ON c.oid = r.ev_class
    JOIN user_namespaces n ON n.oid = c.relnamespace
    WHERE r.rulename <> '_RETURN'
    UNION ALL
    SELECT format('policy %s %s %s %s %s %s', polrelid::regclass, polname, polcmd,
                  polpermissive, pg_get_expr(polqual, polrelid),
                  pg_get_expr(polwithcheck, polrelid))
    FROM pg_policy
    UNION ALL
    SELECT format('comment %s %s %s %s', classoid, objoid, objsubid, md5(description))
    FROM pg_description WHERE objoid >= 16384
    UNION ALL
    SELECT format('large object %s', oid) FROM pg_largeobject_metadata
    UNION ALL
    SELECT format('prepared %s', gid) FROM pg_prepared_xacts
    WHERE database = current_database()
) lines
ORDER BY line
"""

_TABLES = """
SELECT n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p')
  AND n.nspname NOT IN ('pg_catalog', 'information_schema')
  AND n.nspname NOT LIKE 'pg_toast%' AND n.nspname NOT LIKE 'pg_temp%'
ORDER BY 1, 2
"""

# Sequences read since they were made or restarted (last_value is NULL until then).
_SEQUENCES_READ = """
SELECT schemaname, sequencename FROM pg_sequences
WHERE last_value IS NOT NULL AND schemaname NOT LIKE 'pg_temp%'
"""

_END_SESSIONS = """
SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity
WHERE datname = %s AND pid <> pg_backend_pid()
"""


class DatabasePool:
    """Databases at the template's head, lent one per test and wiped when given back.

    ``conninfo(name)`` gives a superuser's libpq URL for a database; ``new_name()`` a
    fresh name this session owns. ``lend()`` returns the name of a wiped database, or
    None when none is idle (the caller clones the template). ``give_back(name)`` wipes it
    for the next test, or drops it when it differs from a fresh clone in anything a wipe
    does not undo (its schema, its settings, the version tables' rows) or a wipe fails.
    """

    def __init__(
        self, template: str, conninfo: Callable[[str], str], new_name: Callable[[], str]
    ) -> None:
        self._conninfo = conninfo
        self._new_name = new_name
        self._idle: list[str] = []
        with psycopg.connect(conninfo(template), autocommit=True) as conn:
            self._fingerprint = _fingerprint(conn)
            tables = conn.execute(_TABLES).fetchall()
            self._kept = {
                table: _rows(conn, table)
                for table in tables
                if conn.execute(
                    sql.SQL("SELECT EXISTS (SELECT FROM {})").format(sql.Identifier(*table))
                ).fetchone()
                == (True,)
            }
            self._emptied = [table for table in tables if table not in self._kept]

    def lend(self) -> str | None:
        """An idle wiped database's name, or None."""
        return self._idle.pop() if self._idle else None

    def give_back(self, name: str, admin: psycopg.Connection[tuple[object, ...]]) -> None:
        """Wipe ``name`` and keep it, under a new name, for the next test; or drop it.

        ``admin`` is an autocommit connection to another database of the same server.
        """
        # The timeout (PostgreSQL 14+) waits for each session to be gone.
        admin.execute(_END_SESSIONS, (name,))
        renamed = self._new_name()
        try:
            admin.execute(
                sql.SQL("ALTER DATABASE {} RENAME TO {}").format(
                    sql.Identifier(name), sql.Identifier(renamed)
                )
            )
            with psycopg.connect(self._conninfo(renamed), autocommit=True) as conn:
                if _fingerprint(conn) != self._fingerprint or any(
                    _rows(conn, table) != rows for table, rows in self._kept.items()
                ):
                    raise _NotLikeNew
                self._wipe(conn)
        except (_NotLikeNew, psycopg.Error):
            # A session that came back (ObjectInUse), a changed schema, a failed wipe.
            for leftover in (name, renamed):
                admin.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(leftover)
                    )
                )
            return
        self._idle.append(renamed)

    def _wipe(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        # Only the tables and sequences the test used: a TRUNCATE of every table makes
        # new files for each, and cost more than the clone it replaces.
        holding_rows = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {} WHERE EXISTS (SELECT FROM {})").format(
                sql.Literal(index), sql.Identifier(*table)
            )
            for index, table in enumerate(self._emptied)
        )
        used = [self._emptied[int(str(index))] for (index,) in conn.execute(holding_rows)]
        if used:
            conn.execute(
                sql.SQL("TRUNCATE {}").format(
                    sql.SQL(", ").join(sql.Identifier(*table) for table in used)
                )
            )
        for schema, sequence in conn.execute(_SEQUENCES_READ).fetchall():
            conn.execute(
                sql.SQL("ALTER SEQUENCE {} RESTART").format(
                    sql.Identifier(str(schema), str(sequence))
                )
            )
        # Counters a test may read (pg_stat_user_tables) start again from zero; a role
        # that may not reset them (on TEST_DATABASE_URL's server) keeps them.
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT pg_stat_reset()")


class _NotLikeNew(Exception):
    """The database differs from a fresh clone in something a wipe does not undo."""


def _fingerprint(conn: psycopg.Connection[tuple[object, ...]]) -> str:
    digest = hashlib.sha256()
    for (line,) in conn.execute(_SCHEMA_FINGERPRINT):
        digest.update(str(line).encode() + b"\n")
    return digest.hexdigest()


def _rows(conn: psycopg.Connection[tuple[object, ...]], table: tuple[str, str]) -> list[str]:
    query = sql.SQL("SELECT t::text FROM {} t ORDER BY 1").format(sql.Identifier(*table))
    return [str(row) for (row,) in conn.execute(query)]
