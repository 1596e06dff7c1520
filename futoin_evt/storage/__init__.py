"""Storage backends behind one contract (:mod:`futoin_evt.storage.base`)."""

from __future__ import annotations

import importlib
import sqlite3
from pathlib import Path
from typing import Final

from .base import Durability, EventStore, StoreUnavailable

POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")


def is_postgres_url(db: str | Path) -> bool:
    return str(db).startswith(POSTGRES_SCHEMES)


async def open_store(db: str | Path, *, durability: Durability = Durability.FULL) -> EventStore:
    """The store ``db`` names: a SQLite file path, or a ``postgresql://`` URL.

    Raises :class:`StoreUnavailable` with a one-sentence reason when it cannot be opened.
    """
    if is_postgres_url(db):
        try:
            postgres = importlib.import_module(".postgres", __package__)
        except ImportError as exc:
            raise StoreUnavailable(
                "a PostgreSQL database needs the extra: pip install 'futoin-evt[postgres]'"
            ) from exc
        store: EventStore = await postgres.PostgresStore.open(str(db), durability=durability)
        return store
    from .sqlite import SqliteStore

    try:
        return await SqliteStore.open(Path(db), durability=durability)
    except (sqlite3.Error, OSError) as exc:
        raise StoreUnavailable(f"cannot open the database {db}: {exc}") from None


__all__ = ["Durability", "EventStore", "StoreUnavailable", "is_postgres_url", "open_store"]
