"""A Regent app with an outbox no scheduler drains: every worker refuses at start-up
(UnregisteredDrainError, in its lifespan), after `python -m app` has started them."""

from app.main import create_app
from app.outbox import Message, Outbox
from app.scheduler import Scheduler
from app.settings import load_settings


async def _deliver(message: Message) -> None:
    """Never called: the app does not start."""


scheduler = Scheduler()
undrained = Outbox("undrained", _deliver)
app = create_app(load_settings(_env_file=None), scheduler)
