"""A user's app of schedule ``billing`` (named in code, not by SCHEDULER_NAME), for the
operator commands to find through REGENT_APP or --app: bare, and behind middleware."""

from starlette.middleware.gzip import GZipMiddleware

from app.main import create_app
from app.scheduler import JobContext, Scheduler, every
from app.settings import load_settings

scheduler = Scheduler(name="billing")


@scheduler.job(every(hours=1), id="report")
async def report(ctx: JobContext) -> None:
    return None


app = create_app(load_settings(_env_file=None), scheduler)
# What a deployment often serves: the app inside ASGI middleware.
wrapped = GZipMiddleware(app)
