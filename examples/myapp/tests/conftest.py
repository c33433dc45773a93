"""Regent's test kit: a throwaway PostgreSQL, a database per test, run_job, drain."""

pytest_plugins = ["regent.testing.plugin"]
