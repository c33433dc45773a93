"""The grant request's schema states what the route accepts, so a client generated
from it sends no request the route refuses as invalid. Both found by schemathesis
(.ci/contract):

- the amount is an integer every JSON client holds exactly (at most 2**53 - 1, RFC
  8259 section 6): with the bigint column's limit as the maximum, a value past it that
  a double rounds below the limit was valid to the client and refused by the app;
- the reference's header rule (it is sent as the Idempotency-Key) is the schema's
  ``pattern``: it was a validator only, so any string of 1 to 200 characters was valid
  to the client.
"""

from __future__ import annotations

import httpx
import jsonschema_rs
import pytest
from pydantic import SecretStr, ValidationError

from app.jobs import build
from app.jobs.credit_grants import GrantIn
from app.main import create_app
from app.settings import load_settings
from app.storable import JSON_INT_MAX

TOKEN = "grant-amounts-api-token-0123456789abcdef"


def test_the_largest_amount_every_json_client_holds_is_accepted() -> None:
    grant = GrantIn(workspace_id=1, amount=JSON_INT_MAX, reference="g-1")
    assert grant.amount == 2**53 - 1


async def test_an_amount_past_what_every_json_client_holds_is_refused_with_422() -> None:
    settings = load_settings(_env_file=None, ENVIRONMENT="test", API_TOKEN=SecretStr(TOKEN))
    jobs = build(settings)
    app = create_app(settings, jobs.scheduler)
    app.include_router(jobs.router)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        answer = await client.post(
            "/api/credits/grants",
            json={"workspace_id": 1, "amount": JSON_INT_MAX + 1, "reference": "g-1"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    assert answer.status_code == 422
    assert answer.json()["detail"][0]["loc"] == ["body", "amount"]


def test_the_schema_states_the_amount_the_app_accepts() -> None:
    amount = GrantIn.model_json_schema()["properties"]["amount"]
    assert (amount["exclusiveMinimum"], amount["maximum"]) == (0, JSON_INT_MAX)
    with pytest.raises(ValidationError):
        GrantIn(workspace_id=1, amount=JSON_INT_MAX + 1, reference="g-1")


@pytest.mark.parametrize(
    "reference",
    ["g-1", "a b", "~!", "x" * 200, " a", "a ", "caf\u00e9", "a\tb", "a\nb", "\x7f", "a\n"],
)
def test_the_schema_pattern_of_a_reference_is_the_rule_the_app_applies(reference: str) -> None:
    schema = GrantIn.model_json_schema()["properties"]["reference"]
    try:
        GrantIn(workspace_id=1, amount=1, reference=reference)
        accepted = True
    except ValidationError:
        accepted = False
    assert jsonschema_rs.validator_for(schema).is_valid(reference) == accepted
