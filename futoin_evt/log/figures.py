"""The store's own figures, as ``serve --metrics`` shows them to the operator: consumers and
their lags, each partition's extent and head, group commit, the connection pool, damaged
events, and whether the store answers at all.

No call takes an acting user: these are the server's own figures for its operator, read on
no user's behalf."""

from __future__ import annotations

from collections.abc import Callable

from ..domain.partition import Partition
from ..stats import DamageStats, WriteStats
from ..storage.base import ConsumerRow, DiscardLimits, Store

__all__ = ["ConsumerRow", "StoreFigures"]


class StoreFigures:
    """The reads of the store the operator's figures need, and nothing else of it."""

    def __init__(self, store: Store) -> None:
        self._store = store

    @property
    def write_stats(self) -> WriteStats:
        """What group commit did since the process started (appends by partition too)."""
        return self._store.write_stats

    @property
    def damage_stats(self) -> DamageStats:
        """The damaged events this process's reads found."""
        return self._store.damage_stats

    def pool_usage(self) -> tuple[int, int] | None:
        """(pooled connections in use, calls waiting for one); None for a store with no pool
        (SQLite)."""
        usage: Callable[[], tuple[int, int]] | None = getattr(self._store, "pool_usage", None)
        return None if usage is None else usage()

    async def consumer_counts(self) -> dict[int, int]:
        """Every user's consumers by partition key, for the partitions that have any."""
        return await self._store.consumer_counts()

    async def discard_limits(self, partition: Partition) -> DiscardLimits:
        """The partition's newest and oldest ids (with what bounds discarding), in one read."""
        return await self._store.partition_log(partition).discard_limits(None)

    async def consumer_lags(self, partition: Partition, limit: int) -> list[ConsumerRow]:
        """The partition's first ``limit`` consumers (by user id and component), each with
        how far behind it is."""
        return await self._store.partition_log(partition).consumer_lags(limit)

    def known_head(self, partition: Partition) -> int:
        """The newest id of the partition this process knows of (no read: it may be newer
        than the last read, and a little older than another process's commit)."""
        return self._store.partition_log(partition).head.head

    async def probe(self) -> None:
        """One trivial read; returns when the store answers, raises what it raises."""
        await self._store.newest_event_id()
