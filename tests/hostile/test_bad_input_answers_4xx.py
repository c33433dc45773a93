"""Numbers past the column type, NUL bytes and lone surrogates get a 4xx on every route,
public and admin; the 422 handler itself survives what it reports."""

from __future__ import annotations

import pytest

from .conftest import AUTH, Hostile

PAST_INT64 = str(2**63)
PAST_INT32 = str(2**31)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("post", f"/admin/api/outboxes/credit_grants/messages/{PAST_INT64}/reset", 404),
        ("get", f"/admin/api/jobs/report_warm/runs?before={PAST_INT64}", 422),
        ("get", "/admin/api/jobs/%00/runs", 422),
        ("get", "/admin/api/outboxes/%00/messages", 422),
    ],
)
async def test_admin_api_answers_4xx_for_ids_that_cannot_exist(
    hostile: Hostile, method: str, path: str, status: int
) -> None:
    response = await hostile.client.request(method, path, headers=AUTH)
    assert response.status_code == status, response.text


@pytest.mark.parametrize(
    "path",
    [
        f"outboxes/credit_grants/messages/{PAST_INT64}/reset",
        "outboxes/%00/messages/1/reset",
        "jobs/%00/run",
        "jobs/%ED%A0%80/run",
    ],
)
async def test_admin_page_actions_answer_4xx_for_ids_that_cannot_exist(
    hostile: Hostile, path: str
) -> None:
    url = f"/admin/s/{hostile.sid}/{path}"
    response = await hostile.client.post(url, data={"csrf": hostile.csrf})
    assert 400 <= response.status_code < 500, response.text


@pytest.mark.parametrize(
    "query", [f"workspace_id={PAST_INT32}", f"workspace_id={PAST_INT64}", "workspace_id=-1"]
)
async def test_stats_refuses_a_workspace_id_past_the_column_type(
    hostile: Hostile, query: str
) -> None:
    response = await hostile.client.get(f"/api/stats?{query}", headers=AUTH)
    assert response.status_code in (404, 422), response.text


@pytest.mark.parametrize(
    "body",
    [
        '{"workspace_id": ' + PAST_INT32 + ', "amount": 5, "reference": "r-1"}',
        '{"workspace_id": 1, "amount": ' + PAST_INT64 + ', "reference": "r-1"}',
        '{"workspace_id": 1, "amount": 5, "reference": "r-\\u0000"}',
        '{"workspace_id": 1, "amount": 5, "reference": "r-\\ud800"}',
        '{"workspace_id": "\\ud800", "amount": 5, "reference": "r-1"}',
    ],
    ids=["workspace-past-int32", "amount-past-int64", "nul", "surrogate", "surrogate-in-422"],
)
async def test_grant_refuses_a_body_the_database_cannot_store_with_422(
    hostile: Hostile, body: str
) -> None:
    response = await hostile.client.post(
        "/api/credits/grants", content=body, headers={"Content-Type": "application/json"} | AUTH
    )
    assert response.status_code == 422, response.text
