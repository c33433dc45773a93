"""This project's own migrations: `python -m app migrate` applies them after Regent's
(under the same migration lock); their revision is kept in alembic_version.
`python -m app revision -m "..."` adds one after the head."""

from app.migration_env import run_users_migrations

run_users_migrations()
