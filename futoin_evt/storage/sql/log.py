"""One partition's log over SQL: what every backend's partition log shares (its state, and
the calls of :mod:`.consumers`, :mod:`.groups` and :mod:`.retention`); the backend gives the
primitives (:class:`~.calls.SqlCalls`), its writer and its reads of pages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Final

from ...domain.dcb import AppendCondition, NewEvent
from ...domain.partition import Partition
from ...domain.stream import EventId
from ...stats import DamageStats
from ..dedup import AppendedForm, PendingKeys, Queued, WriterKey, plan_appends
from ..errors import NotWritable, StoreClosed
from ..head import ClaimWatch, HeadWatch
from ..pages import PagedReads, ReadDialect
from ..recent import DEFAULT_CAPACITY, DEFAULT_MAX_BYTES, RecentEvents
from ..tables import Tables
from .consumers import ConsumerCalls
from .groups import GroupCalls
from .retention import RetentionCalls

#: The ring of recent events of a partition other than ``events``/0: a server may hold many.
PARTITION_RING_DIVISOR: Final = 32


class SqlPartitionLog(ConsumerCalls, GroupCalls, RetentionCalls, PagedReads):
    """A partition's tables, head, recent events and consumers."""

    def __init__(self, partition: Partition, damage_stats: DamageStats, dedup_ms: int) -> None:
        self.partition = partition
        #: Milliseconds a producer's key is remembered (0: keys are ignored).
        self._dedup_ms = dedup_ms
        #: (stream, partition number) as the metrics label it.
        self.labels = (partition.stream, str(partition.number))
        self._tables = Tables.of(partition.key)
        self._key = partition.key
        self.read_dialect = self._read_dialect(self._tables)
        self.damage_stats = damage_stats
        self._last_given = self._last_given_sql(self._tables)
        self._newest = f"SELECT COALESCE(MAX(id), 0) FROM {self._tables.events}"
        #: Its stream was dropped by this process: appends are refused.
        self._retired = False
        #: Its stream aggregates this one (its events come only by copying).
        self._aggregate_of: str | None = None
        self.head = HeadWatch()
        #: Other processes' claims of a consumer.
        self.claims = ClaimWatch()
        #: Keys of this partition's appends in flight.
        self._keys = PendingKeys()
        if partition.key:
            self.recent = RecentEvents(
                DEFAULT_CAPACITY // PARTITION_RING_DIVISOR,
                DEFAULT_MAX_BYTES // PARTITION_RING_DIVISOR,
            )
        else:
            self.recent = RecentEvents()

    # -- the backend's writer -------------------------------------------------------------------

    #: Queue one event (type, data JSON, content type, producer's key, attrs JSON); the future
    #: gets its id once it is durable (the first event's, for its writer's key known in the window).
    submit_append: Callable[..., asyncio.Future[EventId]]

    def _enqueue_planned(self, queued: list[Queued]) -> None:
        """Queue the appends :func:`~..dedup.plan_appends` planned (checked)."""
        raise NotImplementedError

    def _queue_dcb(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> asyncio.Future[int]:
        """Queue a checked DCB append; the future gets its last position, or why not."""
        raise NotImplementedError

    # -- appends ----------------------------------------------------------------------------

    async def append(self, event_type: str, data_json: str) -> EventId:
        """Store one event (type and data already checked); return its id once durable.

        Cancelling the caller does not cancel the write: the event may still be stored.
        """
        return await self.submit_append(event_type, data_json)

    def submit_appends(
        self,
        events: Sequence[AppendedForm],
        keys: Sequence[WriterKey | None] | None = None,
    ) -> asyncio.Future[list[EventId]]:
        """Queue events that are committed together or not at all."""
        self._check_writable()
        queued, answers = plan_appends(self._keys if self._dedup_ms else None, events, keys)
        self._enqueue_planned(queued)
        return asyncio.gather(*answers)

    def _retire(self) -> None:
        """Its stream was dropped by this process: appends are refused from now on."""
        self._retired = True

    def _check_writable(self) -> None:
        if self._retired:
            raise StoreClosed(f"the stream {self.partition.stream} was dropped")
        if self._aggregate_of is not None:
            raise NotWritable(self.partition, self._aggregate_of)

    def dcb_append(
        self, events: Sequence[NewEvent], condition: AppendCondition | None
    ) -> asyncio.Future[int]:
        self._check_writable()
        return self._queue_dcb(events, condition)

    # -- how the backend spells its tables' reads --------------------------------------------

    @staticmethod
    def _read_dialect(tables: Tables) -> ReadDialect:
        """How the backend spells the page reads of ``tables``."""
        raise NotImplementedError

    @staticmethod
    def _last_given_sql(tables: Tables) -> str:
        """Reads the newest id ever given to an event of ``tables``."""
        raise NotImplementedError
