"""`python -m app --app mypkg.main:app --workers 1` serves the user's app on the
embedded database, as it does with two workers (tests/test_cli.py)."""

from ..conftest import ServeUserApp


def test_python_m_app_serves_a_users_own_app_with_one_worker(
    serve_user_app: ServeUserApp,
) -> None:
    served = serve_user_app(workers=1)
    assert served.get("/hello").json() == {"from": "mypkg"}
