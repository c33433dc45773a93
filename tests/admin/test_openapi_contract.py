"""The OpenAPI schema is the whole contract: every status each route answers, with its
body, its headers and its content type, and the token each guarded route takes, so a
client generated from /openapi.json knows them all.

The table below is the specification: a route added to the app must be added here with
the statuses it answers, or the schema test fails.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr

from app.jobs import build
from app.main import create_app
from app.settings import Settings, load_settings

ADMIN = {401, 404, 429}  # the admin guard: wrong token, routes off, too many wrong ones
API = {401, 404, 429}  # the example routes' guard, the same with API_TOKEN

CONTRACT: dict[tuple[str, str], set[int]] = {
    ("get", "/admin/api/jobs"): {200, 422} | ADMIN,
    ("get", "/admin/api/jobs/{job_id}/runs"): {200, 422} | ADMIN,
    ("post", "/admin/api/jobs/{job_id}/run"): {202, 409, 422} | ADMIN,
    ("delete", "/admin/api/jobs/{job_id}"): {200, 409, 422} | ADMIN,
    ("post", "/admin/api/jobs/{job_id}/pause"): {200, 409, 422} | ADMIN,
    ("post", "/admin/api/jobs/{job_id}/resume"): {200, 409, 422} | ADMIN,
    ("get", "/admin/api/leader"): {200} | ADMIN,
    ("get", "/admin/api/outboxes"): {200, 422} | ADMIN,
    ("delete", "/admin/api/outboxes/{name}"): {200, 404, 409, 422} | ADMIN,
    ("post", "/admin/api/outboxes/{name}/reset-stuck"): {200, 404, 422} | ADMIN,
    ("get", "/admin/api/outboxes/{name}/messages"): {200, 422} | ADMIN,
    ("post", "/admin/api/outboxes/{name}/messages/{message_id}/reset"): {200, 409, 422} | ADMIN,
    ("get", "/health/scheduler"): {200, 503},
    ("get", "/metrics"): {200},
    ("get", "/healthz"): {200},
    ("get", "/readyz"): {200, 503},
    ("post", "/api/credits/grants"): {200, 202, 400, 409, 422} | API,
    ("get", "/api/stats"): {200, 422} | API,
}
TOKEN_OF = {"/admin/api/": "ADMIN_TOKEN", "/api/": "API_TOKEN"}
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


API_TOKEN = "contract-api-token-0123456789abcdefgh"


@pytest.fixture(scope="module")
def default_app() -> FastAPI:
    """The default app (its jobs' routes too), both tokens set, not started: what is
    looked at here is answered before any query."""
    settings = load_settings(
        _env_file=None,
        ENVIRONMENT="test",
        ADMIN_TOKEN=SecretStr("contract-admin-token-0123456789abcdef"),
        API_TOKEN=SecretStr(API_TOKEN),
    )
    jobs = build(settings)
    app = create_app(settings, jobs.scheduler)
    app.include_router(jobs.router)
    return app


@pytest.fixture(scope="module")
def schema(default_app: FastAPI) -> dict[str, Any]:
    """The default app's schema."""
    return default_app.openapi()


def _operations(schema: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method, path): operation
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    }


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """``node`` with its $ref followed into components."""
    while "$ref" in node:
        name = node["$ref"].removeprefix("#/components/schemas/")
        node = schema["components"]["schemas"][name]
    return node


def test_the_contract_names_every_route_of_the_schema(schema: dict[str, Any]) -> None:
    assert set(_operations(schema)) == set(CONTRACT)


@pytest.mark.parametrize(("method", "path"), sorted(CONTRACT))
def test_every_route_documents_each_status_it_answers(
    schema: dict[str, Any], method: str, path: str
) -> None:
    documented = {int(status) for status in _operations(schema)[(method, path)]["responses"]}
    assert documented == CONTRACT[(method, path)]


@pytest.mark.parametrize(("method", "path"), sorted(CONTRACT))
def test_every_error_status_documents_its_json_body(
    schema: dict[str, Any], method: str, path: str
) -> None:
    for status, response in _operations(schema)[(method, path)]["responses"].items():
        if int(status) < 400:
            continue
        body = _resolve(schema, response["content"]["application/json"]["schema"])
        assert "detail" in body["required"] or int(status) == 503, (status, body)
        assert body["properties"], (status, body)


@pytest.mark.parametrize(("method", "path"), sorted(CONTRACT))
def test_a_refusal_documents_the_detail_string_the_error_handlers_answer(
    schema: dict[str, Any], method: str, path: str
) -> None:
    for status in ("401", "404", "409", "429"):
        response = _operations(schema)[(method, path)]["responses"].get(status)
        if response is not None:
            body = _resolve(schema, response["content"]["application/json"]["schema"])
            assert body["properties"]["detail"]["type"] == "string", (status, body)


def test_a_validation_error_documents_the_body_its_handler_answers(
    schema: dict[str, Any],
) -> None:
    """app/http_errors.py answers ``loc`` as strings and never echoes the input."""
    for key, operation in _operations(schema).items():
        response = operation["responses"].get("422")
        if response is None:
            continue
        body = _resolve(schema, response["content"]["application/json"]["schema"])
        error = _resolve(schema, body["properties"]["detail"]["items"])
        assert set(error["properties"]) == {"loc", "msg", "type"}, key
        assert error["properties"]["loc"]["items"] == {"type": "string"}, key


@pytest.mark.parametrize(("method", "path"), sorted(CONTRACT))
def test_a_guarded_route_documents_its_challenge_and_its_retry_after(
    schema: dict[str, Any], method: str, path: str
) -> None:
    responses = _operations(schema)[(method, path)]["responses"]
    if "401" in responses:
        assert "WWW-Authenticate" in responses["401"]["headers"]
    if "429" in responses:
        assert responses["429"]["headers"]["Retry-After"]["required"] is True


@pytest.mark.parametrize(("method", "path"), sorted(CONTRACT))
def test_a_guarded_route_declares_the_bearer_token_it_takes(
    schema: dict[str, Any], method: str, path: str
) -> None:
    operation = _operations(schema)[(method, path)]
    tokens = [token for prefix, token in TOKEN_OF.items() if path.startswith(prefix)]
    assert operation.get("security", []) == [{token: []} for token in tokens]
    for token in tokens:
        scheme = schema["components"]["securitySchemes"][token]
        assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")


def test_metrics_is_documented_as_prometheus_text(schema: dict[str, Any]) -> None:
    content = _operations(schema)[("get", "/metrics")]["responses"]["200"]["content"]
    assert list(content) == [PROMETHEUS_TEXT]
    assert content[PROMETHEUS_TEXT]["schema"] == {"type": "string"}


def test_a_route_taking_a_body_documents_the_400_of_one_that_cannot_be_parsed(
    schema: dict[str, Any],
) -> None:
    for key, operation in _operations(schema).items():
        if "requestBody" in operation:
            response = operation["responses"]["400"]
            body = _resolve(schema, response["content"]["application/json"]["schema"])
            assert body["properties"]["detail"]["type"] == "string", key


async def test_an_unparseable_body_is_answered_with_the_documented_400(
    default_app: FastAPI,
) -> None:
    transport = httpx.ASGITransport(app=default_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answer = await client.post(
            "/api/credits/grants",
            content=b"\xff",
            headers={"Authorization": f"Bearer {API_TOKEN}", "Content-Type": "application/json"},
        )
    assert answer.status_code == 400
    assert answer.headers["content-type"] == "application/json"
    assert isinstance(answer.json()["detail"], str)


async def test_metrics_answers_the_documented_prometheus_text(settings: Settings) -> None:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            answer = await client.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"] == PROMETHEUS_TEXT
    assert "# TYPE regent_outbox_messages gauge" in answer.text
