"""The event stream as plain calls, with no FTN3 in them: for doors other than FTN3.

Append, read after a position, learn when the head moves, bounds and time lookup, the
consumer position of a registered (reliable) consumer, and the holds of AMQP consumer groups.
The FTN3 services keep their own wire-shaped methods; both reach the same store, so an event
is the same at every door.
"""

from __future__ import annotations

import asyncio
import calendar
import functools
import re
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final, NamedTuple

from ..domain.groups import GroupClaim, GroupHold
from ..domain.partition import Partition
from ..domain.stream import LIVE_COMPONENT, EventId, UserId, encode_event_data, utc_timestamp
from ..storage.base import PartitionLog, StreamBounds

#: FTN18's ConsumerComponent (futoin.evt.types): what a registered consumer may be called.
COMPONENT_RE: Final = re.compile(r"^[A-Za-z0-9_]{1,16}\Z")


def is_registrable(component: str) -> bool:
    """A name a reliable consumer can be registered under (LIVE is not one)."""
    return COMPONENT_RE.match(component) is not None and component != LIVE_COMPONENT


class StoredEvent(NamedTuple):
    """One stored event: a tuple, made from a store row in one call (readers make one per
    event, so this matters on the hot paths)."""

    id: EventId
    type: str
    #: The event data as the JSON text it is stored as.
    data_json: str
    #: ``YYYY-MM-DDTHH:MM:SSZ`` (when it was added).
    ts: str
    #: The content type of the AMQP ``data`` section the event came as (``""`` for none);
    #: None when it came otherwise.
    content_type: str | None = None

    @property
    def timestamp_ms(self) -> int:
        return ts_to_ms(self.ts)


#: A store row (id, type, data JSON, ts, content type) as a :class:`StoredEvent`.
_make_event: Final = StoredEvent._make


@functools.lru_cache(maxsize=256)
def ts_to_ms(ts: str) -> int:
    """An FTN18 timestamp as milliseconds since the epoch."""
    return calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%SZ")) * 1000


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

    # -- AMQP consumer groups (one link per user, group and partition in the whole cluster) -

    async def claim_group(
        self,
        user_id: UserId,
        group: str,
        epoch: int | None,
        *,
        hold_seconds: float,
        equal_takes_over: bool = False,
        free_only: bool = False,
    ) -> GroupClaim:
        """Take the group for a new link (see
        :meth:`~futoin_evt.storage.base.ConsumerGroups.claim_group`)."""
        return await self._store.claim_group(
            user_id,
            group,
            epoch,
            hold_seconds=hold_seconds,
            equal_takes_over=equal_takes_over,
            free_only=free_only,
        )

    async def hold_groups(self, holds: Sequence[GroupHold], hold_seconds: float) -> list[GroupHold]:
        """Renew the holds; returns those another claim took."""
        return await self._store.hold_groups(holds, hold_seconds)

    async def release_group(self, user_id: UserId, group: str, claim: int) -> None:
        await self._store.release_group(user_id, group, claim)

    async def acknowledge_group(
        self, user_id: UserId, group: str, claim: int, component: str, up_to: int
    ) -> int | None:
        """:meth:`acknowledge`, fenced by the group's claim: None once another claim took it
        (or the consumer is not registered)."""
        return await self._store.acknowledge_group(user_id, group, claim, component, up_to)

    def listen_group_claims(
        self, callback: Callable[[UserId, str, int, int], None]
    ) -> Callable[[], None]:
        """Call ``callback(user, group, claim, epoch)`` when a group is taken, by another
        process (or, on PostgreSQL, this one); returns how to stop."""
        return self._store.claims.listen_groups(callback)
