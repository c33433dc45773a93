"""A user's app whose schedule is named by the Settings it was built with in code
(SCHEDULER_NAME="ledger"), not by its Scheduler nor by the environment."""

from app.main import create_app
from app.scheduler import JobContext, Scheduler, every
from app.settings import load_settings

scheduler = Scheduler()


@scheduler.job(every(hours=1), id="report")
async def report(ctx: JobContext) -> None:
    return None


app = create_app(load_settings(_env_file=None, SCHEDULER_NAME="ledger"), scheduler)
