"""The ASGI app: serve it with `python -m regent --app myapp.main:app`."""

from fastapi import APIRouter
from sqlalchemy import text

from regent import DatabaseDep, create_app

from .jobs import build

scheduler, mails = build()
app = create_app(scheduler=scheduler)
router = APIRouter()


@router.post("/signups", status_code=201)
async def sign_up(email: str, database: DatabaseDep) -> dict[str, int]:
    """Record a signup; the welcome job queues its mail at its next run."""
    async with database.sessions.begin() as session:
        insert = text("INSERT INTO signups (email) VALUES (:email) RETURNING id")
        signup_id = (await session.execute(insert, {"email": email})).scalar_one()
    return {"id": signup_id}


app.include_router(router)
