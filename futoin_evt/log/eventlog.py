"""The event stream as plain calls, with no FTN3 in them: for doors other than FTN3.

Append, read after a position, learn when the head moves, bounds and time lookup, and the
consumer position of a registered (reliable) consumer. The FTN3 services keep their own
wire-shaped methods; both reach the same store, so an event is the same at every door.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any, Final

from ..domain.partition import Partition
from ..domain.stream import EventId, StoredEvent, UserId, encode_event_data, utc_timestamp
from ..storage.base import PartitionLog, StreamBounds

#: A store row (id, type, data JSON, ts, content type) as a :class:`StoredEvent`.
_make_event: Final = StoredEvent._make


class EventLog:
    """One ordered log (a partition of a stream): what a transport calls instead of the store."""

    def __init__(self, store: PartitionLog) -> None:
        self._store = store

    @property
    def partition(self) -> Partition:
        return self._store.partition

    def append(self, event_type: str, data: Any) -> asyncio.Future[EventId]:
        """Queue one event; the future gets its id once it is durable.

        Raises :class:`~futoin_evt.domain.stream.EventRejected` at once when it cannot be an event.
        """
        return self._store.submit_append(event_type, encode_event_data(event_type, data))

    def append_encoded(self, events: list[tuple[str, str, str | None]]) -> asyncio.Future[Any]:
        """Queue checked events (type, data JSON, content type as in :class:`StoredEvent`) in
        order; the future is done once all of them are durable. They are stored in one
        transaction, all or none."""
        if len(events) == 1:
            return self._store.submit_append(*events[0])
        return self._store.submit_appends(events)

    async def read_after(self, after_id: int, limit: int) -> list[StoredEvent]:
        rows = await self._store.read_rows(after_id, limit=limit)
        return list(map(_make_event, rows))

    async def read_of_types(
        self, after_id: int, limit: int, types: Collection[str] | None
    ) -> tuple[list[StoredEvent], int]:
        """Events after ``after_id`` (of ``types`` only, when given: the store reads no
        others), and the id read up to: past the events the filter left out, so the next
        read starts there."""
        head = self.head  # committed before the read starts, so the read sees all up to it
        wanted = sorted(set(types)) if types is not None else None
        rows = await self._store.read_rows(after_id, limit=limit, types=wanted)
        events = list(map(_make_event, rows))
        if len(events) >= limit:
            return events, events[-1].id
        return events, max(head, events[-1].id if events else after_id)

    @property
    def head(self) -> int:
        """The newest committed event id known to this process."""
        return self._store.head.head

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` whenever :attr:`head` moves; returns how to stop."""
        return self._store.head.listen(callback)

    async def bounds(self) -> StreamBounds:
        return await self._store.stream_bounds()

    async def newest_id(self) -> int:
        return await self._store.newest_event_id()

    async def id_before_ms(self, timestamp_ms: int) -> int:
        """The position to read after for events added after ``timestamp_ms``.

        Stored times have whole seconds, so an event added in the second of the instant is
        treated as added at its start (not after it).
        """
        first_second_after = timestamp_ms // 1000 + 1
        before = await self._store.id_before(utc_timestamp(first_second_after))
        return before if before is not None else 0

    # -- registered consumers ---------------------------------------------------------------

    async def register(self, user_id: UserId, component: str) -> bool:
        """Register a reliable consumer (idempotent); True when it is new."""
        return await self._store.register_consumer(user_id, component)

    async def position(self, user_id: UserId, component: str) -> int | None:
        return await self._store.position(user_id, component)

    async def acknowledge(self, user_id: UserId, component: str, up_to: int) -> int | None:
        """Durably move the position forward; None when the consumer is not registered."""
        return await self._store.acknowledge(user_id, component, up_to)
