"""The PostgreSQL backend (``pip install 'futoin-evt[postgres]'``)."""

from .native import add_event, add_event_async
from .store import PostgresStore

__all__ = ["PostgresStore", "add_event", "add_event_async"]
