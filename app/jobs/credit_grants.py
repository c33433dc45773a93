"""Credit grants: money-bearing work through the outbox.

``POST /api/credits/grants`` commits the grant and its outbox row in one transaction,
answers 202, and tries delivery after the response through the outbox's inline attempt;
the drain, every minute, is the durability half. A reused ``reference`` returns the
existing grant and adds nothing when it asks for the same grant, and 409 when it names
another workspace or amount (as payment APIs answer a reused idempotency key). The
reference is the outbox key, sent in the receiver's Idempotency-Key header, so one the
header cannot carry is a 422 (HEADER_KEY_RULE). ``build()`` in ``app.jobs`` mounts the route behind
``Authorization: Bearer <API_TOKEN>`` (see api_token.py): it moves money.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, HTTPException, Request, Response
from pydantic import AfterValidator, BaseModel, Field
from sqlalchemy import text

from app.after_response import run_after_response
from app.db import Database
from app.http_errors import error_response
from app.outbox import (
    HEADER_KEY_PATTERN,
    HttpTransport,
    Message,
    Outbox,
    RetryableDeliveryError,
    header_safe_key,
)
from app.scheduler import Scheduler
from app.settings import Settings
from app.storable_types import Int32Id, PositiveJsonInt, StorableText

__all__ = ["GrantIn", "GrantOut", "build"]

_INSERT = text(
    """
    INSERT INTO credit_grants (workspace_id, amount, reference)
    VALUES (:workspace_id, :amount, :reference)
    ON CONFLICT (reference) DO NOTHING
    RETURNING id
    """
)
_EXISTING = text("SELECT id, workspace_id, amount FROM credit_grants WHERE reference = :reference")
_WORKSPACE = text("SELECT 1 FROM workspaces WHERE id = :workspace_id")


class GrantIn(BaseModel):
    """A grant request; ``reference`` makes it idempotent."""

    workspace_id: Int32Id
    amount: Annotated[
        PositiveJsonInt,
        Field(description="credits to grant; above zero, at most 2**53 - 1 (JSON_INT_MAX)"),
    ]
    # The schema states the header rule as a pattern; the validator answers its words.
    reference: Annotated[
        StorableText,
        Field(min_length=1, max_length=200, json_schema_extra={"pattern": HEADER_KEY_PATTERN}),
        AfterValidator(header_safe_key),
    ]


class GrantOut(BaseModel):
    """The grant's id, and whether this request created it."""

    id: int
    created: bool


async def _wait_for_configuration(message: Message) -> None:
    raise RetryableDeliveryError("CREDIT_GRANTS_URL is not set; the grant stays pending")


def build(settings: Settings, scheduler: Scheduler) -> tuple[Outbox, APIRouter]:
    """The credit_grants outbox (its drain on ``scheduler``) and the grants route."""
    deliver = (
        HttpTransport(settings.credit_grants_url)
        if settings.credit_grants_url
        else _wait_for_configuration
    )
    outbox = Outbox("credit_grants", deliver, scheduler=scheduler)
    router = APIRouter(prefix="/api/credits", tags=["credits"])

    @router.post(
        "/grants",
        status_code=202,
        response_model=GrantOut,
        responses={
            200: {"model": GrantOut, "description": "the existing grant of a reused reference"},
            404: error_response("API_TOKEN is unset, or no workspace of that workspace_id"),
            409: error_response("the reference was used for another grant"),
        },
    )
    async def create_grant(
        grant: GrantIn, request: Request, response: Response, background: BackgroundTasks
    ) -> GrantOut:
        """Grant credits: 202 when created, 200 with the existing grant for a reused
        reference asking for the same grant, 409 for one asking for another, 404 for an
        unknown workspace_id, 422 for a bad body."""
        database: Database = request.app.state.database
        async with database.sessions() as session:
            async with session.begin():
                # A reused reference is answered by the grant it names (200 or 409),
                # whatever workspace the new request names.
                existing = (await session.execute(_EXISTING, grant.model_dump())).first()
                grant_id = None
                if existing is None:
                    if (await session.execute(_WORKSPACE, grant.model_dump())).first() is None:
                        raise HTTPException(
                            404, f"workspace_id {grant.workspace_id} does not exist"
                        )
                    grant_id = (await session.execute(_INSERT, grant.model_dump())).scalar()
                if grant_id is None:  # reused, or taken by a request committed meanwhile
                    existing = (await session.execute(_EXISTING, grant.model_dump())).one()
                    if (existing.workspace_id, existing.amount) != (
                        grant.workspace_id,
                        grant.amount,
                    ):
                        raise HTTPException(
                            409,
                            f"reference {grant.reference!r} was used for a grant of "
                            f"{existing.amount} to workspace_id {existing.workspace_id}; "
                            "a reference names one grant: use a new one for another grant",
                        )
                    response.status_code = 200
                    return GrantOut(id=existing.id, created=False)
                enqueued = await outbox.enqueue(
                    session, grant.model_dump() | {"grant_id": grant_id}, key=grant.reference
                )
            run_after_response(background, session, outbox.attempt, enqueued.id)
        return GrantOut(id=grant_id, created=True)

    return outbox, router
