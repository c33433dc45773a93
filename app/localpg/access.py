"""Who may reach the local server: its account, its two roles, the app role's password."""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from urllib.parse import quote

from ..invocation import program
from .errors import LocalPostgresError

__all__ = [
    "APP_ROLE",
    "HAND_OVER",
    "PASSWORD_FILE",
    "SUPERUSER",
    "local_url",
    "read_password",
    "server_account",
]

# The account a root start runs the server as.
SERVER_ACCOUNT = "postgres"
# The bootstrap superuser (an older version's app role too): peer login only.
SUPERUSER = "regent"
APP_ROLE = "regent_app"
PASSWORD_FILE = "regent.password"
# An older version's app role was the bootstrap superuser (always oid 10), and its tables
# were the superuser's: hand them to the app's role, which must own what it migrates.
HAND_OVER = f"""
DO $$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT format('ALTER SCHEMA %I OWNER TO {APP_ROLE}', nspname) AS statement
          FROM pg_namespace
         WHERE nspowner = 10 AND nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
        UNION ALL
        SELECT format('ALTER %s %s OWNER TO {APP_ROLE}',
                      CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                     WHEN 'm' THEN 'MATERIALIZED VIEW'
                                     WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
                      c.oid::regclass)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relowner = 10 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
           AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
           -- A serial or identity sequence moves with its table.
           AND NOT EXISTS (SELECT FROM pg_depend d
                            WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                              AND d.refclassid = 'pg_class'::regclass
                              AND d.deptype IN ('a', 'i'))
        UNION ALL
        SELECT format('ALTER ROUTINE %s OWNER TO {APP_ROLE}', p.oid::regprocedure)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proowner = 10 AND n.nspname NOT LIKE 'pg\\_%'
           AND n.nspname <> 'information_schema'
        UNION ALL
        SELECT format('ALTER TYPE %s OWNER TO {APP_ROLE}', t.oid::regtype)
          FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE t.typowner = 10 AND t.typtype IN ('e', 'd', 'r')
           AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
    LOOP
        EXECUTE item.statement;
    END LOOP;
END
$$
"""


def local_url(data_dir: Path, port: int, database: str) -> str:
    """libpq URL of ``database`` on the server of ``data_dir`` for the app's role,
    through the server's socket in ``data_dir`` (port ``port`` names it), with the
    password kept in the data directory.

    Raises LocalPostgresError when the password cannot be read (no server was ever
    started there, or it belongs to another user).
    """
    password = read_password(data_dir)
    socket_dir = quote(str(data_dir.absolute()), safe="")
    return f"postgresql://{APP_ROLE}:{password}@/{database}?host={socket_dir}&port={port}"


def read_password(data_dir: Path) -> str:
    path = data_dir / PASSWORD_FILE
    try:
        # token_urlsafe: nothing in it needs escaping in a URL.
        return path.read_text().strip()
    except OSError as exc:
        raise LocalPostgresError(
            f"cannot read the embedded PostgreSQL password {path} ({exc.strerror}); start "
            f"`{program()}` once as this user (it creates it), or set DATABASE_URL"
        ) from None


def server_account() -> pwd.struct_passwd | None:
    """The account the server runs as: None for ourselves, ``postgres`` as root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SERVER_ACCOUNT)
    except KeyError:
        raise LocalPostgresError(
            "running as root, and PostgreSQL refuses root, but there is no 'postgres' "
            "user to run it as (never 'nobody': every process of that user could read "
            "the database); create it with `useradd --system --user-group --no-create-home "
            "--shell /usr/sbin/nologin postgres`, or run as a normal user, or set "
            "DATABASE_URL"
        ) from None
