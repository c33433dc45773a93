"""A PostgreSQL server run as a child of this process: the embedded default and the
throwaway server of the test suite.

The server is started directly (not through pg_ctl) so that it stays our child: it gets
a parent-death signal, and a SIGKILL of this process still takes it down. As root it
runs as the ``postgres`` account, because initdb and postgres refuse root; with no such
account a root start is refused (never ``nobody``: every process of that user could
read the database's files).

The server is its owner's alone. It listens on a Unix socket in its data directory
(mode 0700: only the server's account, and root, may enter it), and on no TCP port
unless asked (``tcp=True``, REGENT_PG_TCP): another local user can neither reach it nor
stand in for it on a port while it is down, and be sent a password. Two roles:

- ``regent``, the bootstrap superuser, has no password. It logs in only through the
  socket, only as the server's account or the user who started it (``peer``, mapped in
  pg_ident.conf). This module uses it to create the application's role and database, and its
  connections resolve names in pg_catalog only (search_path set by the connection), so
  nothing the app's role leaves in its database runs as the superuser.
- ``regent_app``, the application's role: no superuser, no CREATEDB, CREATEROLE or
  REPLICATION; it owns the app's database and what is in it, so it cannot run programs
  as the server's account (``COPY ... TO PROGRAM``). Its password (scram-sha-256) is
  kept in ``regent.password`` (mode 0600) in the data directory; every URL this module
  hands out carries it.

pg_hba.conf and pg_ident.conf are written at every start, so a data directory an older
version made (``trust``, or the app logging in as the superuser) is moved to this
before its server listens; on start the superuser's objects in the app's database are
handed to the app's role, and the app's role gets a new password. Every file the server
writes (the log beside the data directory too) is mode 0600.
"""

from .access import APP_ROLE, local_url
from .binaries import find_bindir
from .errors import LocalPostgresError
from .processes import free_port, user_name
from .server import LocalPostgres

__all__ = [
    "APP_ROLE",
    "LocalPostgres",
    "LocalPostgresError",
    "find_bindir",
    "free_port",
    "local_url",
    "user_name",
]
