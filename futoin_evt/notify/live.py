"""Reading notifications for subscribers: shared near the head, pushed down behind it.

:class:`LiveEvents` keeps the newest events of the log parsed, in a ring that every
subscriber at the head reads from: one store read and one parse per event, however many
subscribe. The ring reads only the event types its subscribers can match (their selectors'
pinned types, when every one pins them). A subscriber behind the ring, or one that wants a
type the ring leaves out, reads the store itself with its own types pushed down.

:class:`Subscription` is one subscriber, whatever its door: log events after a position and
management events from the bus, through its selector, in batches as the door asks.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ..log.eventlog import EventLog
from .catalog import EventCatalog
from .management import ManagementBus, is_management_type
from .message import Notification
from .selector import Selector

if TYPE_CHECKING:
    from ..auth.users import Principal

#: Parsed events kept for subscribers at the head.
RING_EVENTS: Final = 8192
#: Events read from the store at once.
READ_BATCH: Final = 1000
#: Management events kept for a subscriber that does not take them; older ones are dropped.
MAX_PENDING_MANAGEMENT: Final = 1000


@dataclass(slots=True)
class _Interest:
    """What one registered subscriber may match (None: any type)."""

    types: frozenset[str] | None


class LiveEvents:
    """Parsed events of one log, shared by its subscribers."""

    def __init__(
        self, events: EventLog, catalog: EventCatalog | None = None, capacity: int = RING_EVENTS
    ) -> None:
        self.events = events
        self.catalog = catalog if catalog is not None else EventCatalog(events)
        self._capacity = capacity
        self._interests: list[_Interest] = []
        self._ids: list[int] = []
        self._ring: list[Notification] = []
        #: The ring holds every event of :attr:`_ring_types` in (_from, _to].
        self._from = -1
        self._to = -1
        self._ring_types: frozenset[str] | None = None
        #: The ring's ids and events by type, for subscribers that pin their types.
        self._by_type: dict[str, tuple[list[int], list[Notification]]] = {}
        self._refilling: asyncio.Future[None] | None = None
        #: Events read from the store (all readers); what push-down saves shows here.
        self.rows_read = 0

    def register(self, types: frozenset[str] | None) -> Callable[[], None]:
        """A subscriber that can match ``types`` only; returns how to unregister."""
        interest = _Interest(types)
        self._interests.append(interest)
        return lambda: self._interests.remove(interest)

    def _wanted_types(self) -> frozenset[str] | None:
        wanted: set[str] = set()
        for interest in self._interests:
            if interest.types is None:
                return None
            wanted |= interest.types
        return frozenset(wanted)

    async def read(
        self, after_id: int, types: frozenset[str] | None, limit: int = READ_BATCH
    ) -> tuple[list[Notification], int]:
        """Events after ``after_id`` (of ``types`` when given), at most ``limit``, and the id
        read up to."""
        head = self.events.head
        if after_id >= head:
            return [], after_id
        if after_id >= self._to:
            if after_id > self._to:  # ahead of the ring: start it here
                self._reset(after_id)
            await self._refill()
        if self._from <= after_id < self._to and _within(types, self._ring_types):
            return self._from_ring(after_id, types, limit)
        events, reached = await self.events.read_of_types(after_id, limit, types)
        self.rows_read += len(events)
        return [Notification.of(event) for event in events], reached

    def _from_ring(
        self, after_id: int, types: frozenset[str] | None, limit: int
    ) -> tuple[list[Notification], int]:
        if types is None:
            start = bisect.bisect_right(self._ids, after_id)
            result = self._ring[start : start + limit]
        else:  # only the pinned types' events are looked at
            result = []
            for event_type in types:
                ids, notifications = self._by_type.get(event_type, _NONE)
                start = bisect.bisect_right(ids, after_id)
                result.extend(notifications[start : start + limit])
            if len(types) > 1:
                result.sort(key=_id_of)
            del result[limit:]
        if len(result) >= limit:
            return result, _id_of(result[-1])
        return result, self._to

    def _reset(self, after_id: int) -> None:
        self._ids.clear()
        self._ring.clear()
        self._by_type.clear()
        self._from = self._to = after_id

    async def _refill(self) -> None:
        """Read what follows the ring, once for everyone waiting for it."""
        if self._refilling is None or self._refilling.done():
            self._refilling = asyncio.ensure_future(self._read_next())
        await asyncio.shield(self._refilling)

    async def _read_next(self) -> None:
        wanted = self._wanted_types()
        if wanted != self._ring_types:
            self._ring_types = wanted
            self._reset(self._to)
        after = self._to
        log_types = None if wanted is None else [t for t in wanted if not is_management_type(t)]
        events, reached = await self.events.read_of_types(after, READ_BATCH, log_types)
        self.rows_read += len(events)
        notifications = [Notification.of(event) for event in events]
        if self._to != after:  # reset meanwhile: what was read belongs to no ring
            return
        by_type = self._by_type
        for notification in notifications:
            event_id = _id_of(notification)
            self._ids.append(event_id)
            self._ring.append(notification)
            of_type = by_type.get(notification.type)
            if of_type is None:
                of_type = by_type[notification.type] = ([], [])
            of_type[0].append(event_id)
            of_type[1].append(notification)
        self._to = reached
        self.catalog.note(notifications, (after, reached) if wanted is None else None)
        if len(self._ring) > self._capacity:
            drop = len(self._ring) - self._capacity // 2
            self._from = self._ids[drop - 1]
            del self._ids[:drop], self._ring[:drop]
            for event_type, (ids, kept_events) in list(by_type.items()):
                kept = bisect.bisect_right(ids, self._from)
                del ids[:kept], kept_events[:kept]
                if not ids:
                    del by_type[event_type]


_NONE: Final[tuple[list[int], list[Notification]]] = ([], [])


def _id_of(notification: Notification) -> int:
    assert notification.id is not None  # events of the log have ids
    return notification.id


def _within(types: frozenset[str] | None, ring_types: frozenset[str] | None) -> bool:
    if ring_types is None:
        return True
    return types is not None and types <= ring_types


@dataclass(slots=True)
class Subscription:
    """One subscriber: matching notifications after ``after_id``, as :meth:`next` is called.

    ``management`` is a filter on the management events this subscriber may see at all (its
    user's own, say); None: none at all.
    """

    live: LiveEvents
    bus: ManagementBus | None
    selector: Selector | None
    after_id: int
    management: Callable[[Notification], bool] | None = None
    #: Management events dropped because the subscriber did not take them in time.
    dropped: int = 0
    _pending: deque[Notification] = field(default_factory=deque)
    #: Set when there may be more to read (doors also set it when they can send again).
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    _stops: list[Callable[[], None]] = field(default_factory=list)
    _log_types: frozenset[str] | None = None
    _reads_log: bool = True

    def start(self) -> Subscription:
        pinned = self.selector.event_types if self.selector is not None else None
        if pinned is not None:
            self._log_types = frozenset(t for t in pinned if not is_management_type(t))
            self._reads_log = bool(self._log_types)
        if self._reads_log:
            self._stops.append(self.live.register(self._log_types))
            self._stops.append(self.live.events.listen(self.wake.set))
        wants_management = pinned is None or any(is_management_type(t) for t in pinned)
        if self.bus is not None and self.management is not None and wants_management:
            self._stops.append(self.bus.listen(self._on_management))
        return self

    def close(self) -> None:
        for stop in self._stops:
            stop()
        self._stops.clear()

    def _on_management(self, notification: Notification) -> None:
        assert self.management is not None
        if not self.management(notification):
            return
        if self.selector is not None and not self.selector.matches(notification):
            return
        self._pending.append(notification)
        if len(self._pending) > MAX_PENDING_MANAGEMENT:
            self._pending.popleft()
            self.dropped += 1
        self.wake.set()

    def has_more(self) -> bool:
        return bool(self._pending) or (self._reads_log and self.live.events.head > self.after_id)

    async def next(self, limit: int = READ_BATCH) -> list[Notification]:
        """The next matching notifications (at most ``limit``); waits until there is one."""
        while True:
            self.wake.clear()
            batch = await self.poll(limit)
            if batch:
                return batch
            if not self.has_more():
                await self.wake.wait()

    async def poll(self, limit: int = READ_BATCH) -> list[Notification]:
        """Matching notifications there are now, at most ``limit`` (maybe none): the pending
        management events, then log events from one read."""
        batch = self.take_pending(limit)
        if self._reads_log and len(batch) < limit and self.live.events.head > self.after_id:
            batch.extend(await self.read_log(limit - len(batch)))
        return batch

    def take_pending(self, limit: int) -> list[Notification]:
        pending = self._pending
        return [pending.popleft() for _ in range(min(limit, len(pending)))]

    async def read_log(self, limit: int) -> list[Notification]:
        """Matching log events after :attr:`after_id` from one read; moves it on."""
        notifications, reached = await self.live.read(self.after_id, self._log_types, limit)
        self.after_id = reached
        if self.selector is None:
            return notifications
        # What was read has the pinned types only: their tests need not run again.
        matches = self.selector.matches_of_pinned
        return [n for n in notifications if matches(n)]


def management_visible_to(principal: Principal) -> Callable[[Notification], bool]:
    """Which management events a user may see: an admin all, others those about themselves."""
    if principal.is_admin:
        return lambda _n: True
    name = principal.name
    return lambda n: type(n.data) is dict and n.data.get("user") == name
