"""Event storage: the contract (:mod:`.base`) and its backends, chosen by :func:`open_store`."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Final

from ..domain.stream import DEFAULT_DEDUP_WINDOW
from .base import DEFAULT_POOL, Durability, PoolLimits, Store
from .errors import StoreUnavailable
from .sql.scrub import CheckReport
from .sqlite.check import quick_check_sqlite, scrub_sqlite

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

    Raises :class:`~.errors.StoreUnavailable` (one sentence) when it cannot be opened.
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


async def check_database(db: str | Path) -> CheckReport:
    """Scrub the database ``db`` names (reads only; see :mod:`.sql.scrub`). Raises
    :class:`~.errors.StoreUnavailable` when it is not there or cannot be reached, and
    :class:`~.errors.StoreDamaged` for a SQLite file too damaged to read its schema."""
    if is_postgres_url(db):
        try:
            from .postgres.check import scrub_postgres
        except ImportError:
            raise StoreUnavailable(
                "a PostgreSQL database needs the driver: pip install 'futoin-evt[postgres]'"
            ) from None
        return await scrub_postgres(str(db))
    return await asyncio.to_thread(scrub_sqlite, Path(db))


async def start_check(db: str | Path, seconds: float) -> bool:
    """What ``serve`` checks before it starts: on SQLite, ``PRAGMA quick_check`` of an
    existing file for at most ``seconds`` (True when it ran to its end); raises
    :class:`~.errors.StoreDamaged` for a malformed file. Nothing on PostgreSQL (True)."""
    if is_postgres_url(db):
        return True
    return await asyncio.to_thread(quick_check_sqlite, Path(db), seconds)
