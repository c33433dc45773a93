"""Operating Regent: the admin API and page, the scheduler health check, and the queries
the CLI shares with them."""

from ..operations.errors import AdminError, Conflict, NotFound, UnknownJobError
from .api import admin_error_response
from .api import router as api_router
from .health import router as health_router
from .index import router as index_router
from .page import router as page_router

__all__ = [
    "AdminError",
    "Conflict",
    "NotFound",
    "UnknownJobError",
    "admin_error_response",
    "api_router",
    "health_router",
    "index_router",
    "page_router",
]
