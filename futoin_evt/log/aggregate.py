"""Aggregated streams (FTN18 2.3.3): the copying that fills them, in every serving process.

An aggregated stream (``futoin-evt stream add NAME --aggregate SOURCE``) has one partition
that holds every event of every partition of its source, with new ids and each source
partition's order kept. Every serving process runs an :class:`Aggregator`; for each
aggregate it competes for the aggregate's lease, and the one that holds it copies:

- in batches, each one transaction that renews the lease, copies up to ``batch`` events
  and moves the source positions (:meth:`~futoin_evt.storage.base.Aggregates.copy_into_aggregate`),
  so a process killed at any moment leaves every source event copied exactly once;
- woken by the heads of the source's partitions (new events), with a copy (and a renewal)
  at least every third of the lease as the fallback;
- following partitions the source grows (the store adds them as sources in the same
  transaction as the partitions; the wake-ups follow the registry).

The others try to take the lease every half lease: a process that stops gracefully gives it
up, one that dies loses it when it expires, so another takes over within 1.5 leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..domain.partition import Partition, StreamInfo
from ..storage.base import Store
from .streams import StreamRegistry

logger = logging.getLogger(__name__)

#: Seconds a lease lasts unless renewed (``serve --aggregate-lease``).
DEFAULT_LEASE_SECONDS: Final = 10.0
#: Events per copying transaction.
DEFAULT_BATCH: Final = 2000


@dataclass(frozen=True, slots=True)
class AggregateConfig:
    #: How long a lease lasts unless renewed: how soon another process takes over from one
    #: that died (within 1.5 times this).
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    #: Events per copying transaction.
    batch: int = DEFAULT_BATCH


class Aggregator:
    """``server.aggregator``: the copying into every aggregated stream of the database."""

    def __init__(
        self, store: Store, streams: StreamRegistry, config: AggregateConfig = AggregateConfig()
    ) -> None:
        self._store = store
        self._streams = streams
        self.config = config
        #: Who this process is in the leases.
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._copiers: dict[int, _Copier] = {}
        self._stop_listening: Callable[[], None] | None = None

    def start(self) -> None:
        self._stop_listening = self._streams.listen(self._follow)
        self._follow()

    @property
    def copying(self) -> list[Partition]:
        """The aggregates this process holds the lease of now."""
        return [c.aggregate for c in self._copiers.values() if c.holding]

    def _follow(self) -> None:
        """Start, update and stop copiers as the registry changes."""
        aggregates: dict[int, tuple[StreamInfo, StreamInfo | None]] = {}
        for info in self._streams:
            if info.aggregate_of is not None:
                aggregates[info.partitions[0].key] = (info, self._streams.get(info.aggregate_of))
        for key in self._copiers.keys() - aggregates.keys():
            self._copiers.pop(key).stop()
        for key, (info, source) in aggregates.items():
            sources = source.partitions if source is not None else ()
            copier = self._copiers.get(key)
            if copier is None:
                copier = self._copiers[key] = _Copier(self, info.partitions[0], sources)
                copier.start()
            else:
                copier.follow(sources)

    async def close(self) -> None:
        """Stop copying and give the leases up, so another process takes over at once."""
        if self._stop_listening is not None:
            self._stop_listening()
        copiers, self._copiers = list(self._copiers.values()), {}
        for copier in copiers:
            copier.stop()
        for copier in copiers:
            await copier.stopped()


class _Copier:
    """The copying into one aggregate, while this process holds its lease."""

    def __init__(
        self, owner: Aggregator, aggregate: Partition, sources: tuple[Partition, ...]
    ) -> None:
        self._owner = owner
        self.aggregate = aggregate
        self._sources = sources
        self.holding = False
        self._wake = asyncio.Event()
        self._unlisten: list[Callable[[], None]] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"futoin-evt-aggregate-{self.aggregate}")

    def follow(self, sources: tuple[Partition, ...]) -> None:
        if sources != self._sources:
            self._sources = sources
            if self.holding:
                self._listen(True)
            self._wake.set()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for stop in self._unlisten:
            stop()
        self._unlisten = []

    async def stopped(self) -> None:
        """After :meth:`stop`: once the task has ended, give the lease up."""
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.holding:
            try:
                await self._owner._store.release_aggregate(self.aggregate, self._owner.holder)
            except Exception as exc:  # it expires by itself
                logger.warning("giving up the lease of %s failed: %s", self.aggregate.stream, exc)

    def _listen(self, on: bool) -> None:
        """Be woken by the sources' heads (only while copying: on SQLite a head that is
        listened to is polled for other processes' events)."""
        for stop in self._unlisten:
            stop()
        self._unlisten = []
        if on:
            store = self._owner._store
            self._unlisten = [
                store.partition_log(p).head.listen(self._wake.set) for p in self._sources
            ]

    def _held(self, holding: bool, failed: bool = False) -> None:
        if holding != self.holding:
            self.holding = holding
            self._listen(holding)
            if holding:
                logger.info("copying into the aggregate %s", self.aggregate.stream)
            elif not failed:
                logger.info("another process copies into the aggregate %s", self.aggregate.stream)

    async def _run(self) -> None:
        config = self._owner.config
        store = self._owner._store
        turn = 0
        while True:
            self._wake.clear()
            try:
                done = await store.copy_into_aggregate(
                    self.aggregate, self._owner.holder, config.lease_seconds, config.batch, turn
                )
            except Exception as exc:  # the database is away for a moment: the next turn
                logger.warning(
                    "copying into the aggregate %s failed: %s", self.aggregate.stream, exc
                )
                self._held(False, failed=True)
                done = None
            else:
                self._held(done is not None)
            turn += 1
            if done is not None and done.copied >= config.batch:
                continue  # more is waiting
            wait = config.lease_seconds / (3 if self.holding else 2)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
