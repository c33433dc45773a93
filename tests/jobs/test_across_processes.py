"""Three processes run the same job at once: one SMS per booking, one charge per cycle."""

import subprocess
import sys

import psycopg
import pytest

pytestmark = pytest.mark.multiprocess


def _run_three(job: str, database_url: str) -> None:
    workers = [
        subprocess.Popen([sys.executable, "-m", "tests.procs.job_once", job, database_url])
        for _ in range(3)
    ]
    assert [worker.wait(120) for worker in workers] == [0, 0, 0]


def test_three_processes_send_one_sms_per_booking_and_window(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE sms_fake (phone text NOT NULL)")
        workspace = conn.execute("INSERT INTO workspaces (name) VALUES ('w') RETURNING id")
        (workspace_id,) = workspace.fetchone() or (0,)
        conn.execute(
            "INSERT INTO bookings (workspace_id, phone, starts_at)"
            " SELECT %s, '+41' || n, timestamptz '2026-03-02 09:00+00' + interval '5 hours'"
            " FROM generate_series(1, 200) AS n",
            (workspace_id,),
        )
    _run_three("reminders", database_url)
    with psycopg.connect(database_url) as conn:
        sent = conn.execute("SELECT count(*), count(DISTINCT phone) FROM sms_fake").fetchone()
    assert sent == (200, 200)


def test_three_processes_charge_each_subscription_once(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE psp_fake (reference text NOT NULL, amount bigint NOT NULL)")
        workspace = conn.execute("INSERT INTO workspaces (name) VALUES ('w') RETURNING id")
        (workspace_id,) = workspace.fetchone() or (0,)
        conn.execute(
            "INSERT INTO subscriptions (workspace_id, amount_cents, next_charge_at)"
            " SELECT %s, 1900, timestamptz '2026-03-02 08:00+00' FROM generate_series(1, 100)",
            (workspace_id,),
        )
    _run_three("charges", database_url)
    with psycopg.connect(database_url) as conn:
        charged = conn.execute(
            "SELECT count(*), count(DISTINCT reference) FROM psp_fake"
        ).fetchone()
        recorded = conn.execute(
            "SELECT count(*) FROM subscription_charges WHERE status = 'succeeded'"
        ).fetchone()
    assert charged == (100, 100)
    assert recorded == (100,)
