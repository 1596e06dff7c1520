"""The embedded backend: one SQLite file in WAL mode (:mod:`.store`), its group-commit writer
(:mod:`.writer`) and its read thread (:mod:`.reads`)."""

from .native import add_event, add_event_async
from .store import SqliteStore

__all__ = ["SqliteStore", "add_event", "add_event_async"]
