"""The store's calls over SQL that every backend shares: its partition logs, the registry's
reads, users, grants, the schema registry, aggregates, the Event Hubs checkpoints, kept AMQP
termini and the console's sessions. A backend's store inherits this and its own partition
log, and gives the primitives (:class:`~.calls.SqlCalls`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, Self, TypeVar

from ...domain.partition import (
    DEFAULT_STREAM,
    Partition,
    StreamInfo,
    check_partition_count,
    check_stream_name,
)
from ...stats import DamageStats, WriteStats
from ..base import AggregateCopy
from ..dedup import window_ms
from .aggregates import AggregateCalls, note_aggregates
from .checkpoints import CheckpointTables
from .grants import GrantCalls
from .kafka import KafkaTables
from .log import SqlPartitionLog
from .schemas import SchemaCalls
from .scram import ScramTables
from .sessions import ConsoleSessionTables
from .streams import StreamCalls
from .termini import TerminiTables
from .users import UserCalls

logger = logging.getLogger(__name__)

_Log = TypeVar("_Log", bound=SqlPartitionLog)


class SqlStore(
    StreamCalls,
    UserCalls,
    GrantCalls,
    SchemaCalls,
    AggregateCalls,
    CheckpointTables,
    TerminiTables,
    KafkaTables,
    ConsoleSessionTables,
    ScramTables,
    Generic[_Log],
):
    """The shared calls of a store (see the module); ``_Log`` is the backend's partition
    log, made by :meth:`_open_log`."""

    #: The partition logs open in this process, by key.
    _logs: dict[int, _Log]
    #: Partition keys of aggregated streams, with their sources.
    _aggregates: dict[int, str]
    _streams_listeners: set[Callable[[int], None]]
    _closing: bool
    _watcher: asyncio.Task[None] | None

    def _start(self, dedup_window: float, description: str) -> None:
        """The state every store has, before it becomes the log of ``events``/0."""
        #: Seconds a producer's key is remembered (0: keys are ignored), and in milliseconds.
        self.dedup_window = dedup_window
        self._dedup_ms = window_ms(dedup_window)
        #: Where the data is, for messages (a path, or a URL without its password).
        self.description = description
        self._closing = False
        #: The damaged events reads found, and what group commit did (read by the metrics).
        self.damage_stats = DamageStats()
        self.write_stats = WriteStats()
        self._aggregates = {}
        self._streams_listeners = set()
        self._watcher = None

    def _open_log(self, partition: Partition) -> _Log:
        raise NotImplementedError

    async def _copy(
        self, aggregate: Partition, holder: str, lease_seconds: float, limit: int, start: int
    ) -> AggregateCopy | None:
        """One copying transaction (:func:`.aggregates.copy_steps`) under the backend's lock."""
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def _add_stream(self, name: str, partitions: int, aggregate_of: str | None) -> StreamInfo:
        """The stream and its partitions' tables, in one transaction that moves the
        registry's version on; KeyError when it exists (names checked)."""
        raise NotImplementedError

    async def _grow_stream(self, name: str, partitions: int) -> StreamInfo:
        """Partitions added up to ``partitions`` (see :func:`.streams.grows`), in one
        transaction; KeyError when there is no such stream."""
        raise NotImplementedError

    async def _drop_stream(self, name: str) -> list[int] | None:
        """The stream, its partitions' tables and rows gone in one transaction; the keys of
        its partitions, None when there is no such stream."""
        raise NotImplementedError

    async def _streams_changed(self) -> None:
        """After this process changed the registry: tell its listeners where the backend
        does not (by default it does: nothing to do)."""

    async def add_stream(
        self, name: str, partitions: int, *, aggregate_of: str | None = None
    ) -> StreamInfo:
        check_stream_name(name)
        check_partition_count(partitions)
        info = self._known([await self._add_stream(name, partitions, aggregate_of)])[0]
        await self._streams_changed()
        return info

    async def grow_stream(self, name: str, partitions: int) -> StreamInfo:
        check_partition_count(partitions)
        info = await self._grow_stream(name, partitions)
        await self._streams_changed()
        return info

    async def drop_stream(self, name: str) -> bool:
        if name == DEFAULT_STREAM:
            raise ValueError(f"the stream {DEFAULT_STREAM} cannot be dropped")
        keys = await self._drop_stream(name)
        if keys is None:
            return False
        for key in keys:
            dropped = self._logs.pop(key, None)
            if dropped is not None:
                dropped._retire()
        await self._streams_changed()
        return True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    def partition_log(self, partition: Partition) -> _Log:
        found = self._logs.get(partition.key)
        if found is None:
            found = self._logs[partition.key] = self._open_log(partition)
            found._aggregate_of = self._aggregates.get(partition.key)
        return found

    def _known(self, infos: list[StreamInfo]) -> list[StreamInfo]:
        return note_aggregates(infos, self._aggregates, self._logs)

    def listen_streams(self, callback: Callable[[int], None]) -> Callable[[], None]:
        """Call ``callback(version)`` when the registry changes (see
        ``hears_all_stream_changes``); returns the function that stops it."""
        self._streams_listeners.add(callback)
        return lambda: self._streams_listeners.discard(callback)

    def _start_watching(self, interval: float) -> None:
        """Poll the newest id of each partition someone waits on, every ``interval``
        seconds."""
        if self._watcher is None:
            self._watcher = asyncio.create_task(self._watch(interval), name="futoin-evt-watch")

    async def _watch(self, interval: float) -> None:
        while not self._closing:
            await asyncio.sleep(interval)
            for partition_log in list(self._logs.values()):
                if partition_log.head.waiting:
                    try:
                        partition_log.head.advance(await partition_log.newest_event_id())
                    except Exception as exc:  # the store is closing, or the database is busy
                        logger.debug("checking for new events failed: %s", exc)

    async def copy_into_aggregate(
        self, aggregate: Partition, holder: str, lease_seconds: float, limit: int, start: int = 0
    ) -> AggregateCopy | None:
        done = await self._copy(aggregate, holder, lease_seconds, limit, start)
        if done is not None and done.copied:
            self.partition_log(aggregate).head.advance(done.head)
        return done
