"""The ASGI app: serve it with `python -m app --app myapp.main:app`."""

from app.main import create_app

from .jobs import build

scheduler, mails = build()
app = create_app(scheduler=scheduler)
