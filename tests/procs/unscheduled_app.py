"""ASGI apps without a Regent scheduler, for `python -m app --app` to refuse."""

from fastapi import FastAPI

from app.main import create_app
from app.settings import load_settings

# An ASGI app that is not Regent's at all.
plain = FastAPI()
# Regent's app, built without a scheduler: it would serve and fire nothing.
unscheduled = create_app(load_settings(_env_file=None))
