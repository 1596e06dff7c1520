"""Event storage: the contract (:mod:`.base`) and its backends, chosen by :func:`open_store`."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from ..domain.stream import DEFAULT_DEDUP_WINDOW
from .base import DEFAULT_POOL, Durability, PoolLimits, Store, StoreUnavailable

POSTGRES_SCHEMES: Final = ("postgresql://", "postgres://")


def is_postgres_url(db: str | Path) -> bool:
    return isinstance(db, str) and db.startswith(POSTGRES_SCHEMES)


async def open_store(
    db: str | Path,
    *,
    durability: Durability = Durability.FULL,
    pool: PoolLimits = DEFAULT_POOL,
    dedup_window: float = DEFAULT_DEDUP_WINDOW,
) -> Store:
    """Open (and create or migrate) the store ``db`` names: a ``postgresql://`` or
    ``postgres://`` URL for PostgreSQL (with ``pool``), anything else a SQLite file path.
    ``dedup_window``: seconds a producer's key of an event is remembered (0: keys are
    ignored; see :meth:`~.base.EventLog.submit_append`).

    Raises :class:`~.base.StoreUnavailable` (one sentence) when it cannot be opened.
    """
    if is_postgres_url(db):
        try:
            from .postgres import PostgresStore
        except ImportError:
            raise StoreUnavailable(
                "a PostgreSQL database needs the driver: pip install 'futoin-evt[postgres]'"
            ) from None
        return await PostgresStore.open(
            str(db), durability=durability, pool=pool, dedup_window=dedup_window
        )
    from .sqlite import SqliteStore

    return await SqliteStore.open(db, durability=durability, dedup_window=dedup_window)
