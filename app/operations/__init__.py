"""What an operator reads and does, shared by the admin API and page, the CLI and
/metrics: jobs (list, pause, run now, forget), their runs, the leadership, the outboxes
and their messages, each value as an operator reads it (``display``). Every read
compares times with the lease clock (``reading``); a refusal is an ``AdminError`` whose
``status`` is the HTTP answer. Nothing here imports FastAPI: the CLI starts without it."""

from .errors import AdminError, Conflict, NotFound, RetiredJobError, UnknownJobError

__all__ = ["AdminError", "Conflict", "NotFound", "RetiredJobError", "UnknownJobError"]
