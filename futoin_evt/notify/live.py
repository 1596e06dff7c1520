"""Reading notifications for subscribers: shared near the head, pushed down behind it.

:class:`LiveEvents` keeps the newest events of the log parsed, in a ring that every
subscriber at the head reads from: one store read and one parse per event, however many
subscribe. The ring reads only the event types its subscribers can match (their selectors'
pinned types, when every one pins them). Each distinct selector is evaluated once per new
event of the ring, for all the subscribers that have it, and only over the events of the
types it pins (an index by type): a subscriber at the head takes its matches from that
shared result. A subscriber behind the ring, or one that wants a type the ring leaves out,
reads the store itself with its own types pushed down, and evaluates its own selector.

:class:`Subscription` is one subscriber, whatever its door: log events after a position in
each partition it reads and management events from the bus, through its selector, in
batches as the door asks. :class:`LiveStreams` keeps one :class:`LiveEvents` per partition
that subscribers read, never one per subscriber; a door that names the subscriber has their
``read`` right on the stream checked before anything of it is told (whether it exists too).
A selector's shared matches are kept per partition's reader, so a subscriber is only ever
given events of the stream it subscribed to. When a stream is dropped, its readers are ended
and forgotten (in every process: each follows its registry), and each subscription of it
ends with :class:`UnknownStream` (:attr:`Subscription.gone`), which each door tells its
subscriber as it tells of a stream that is not there.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from ..domain.management import ManagementBus, is_management_type
from ..domain.notification import BASE_ATTRIBUTES, Notification
from ..domain.partition import DEFAULT_STREAM, Partition, StreamInfo, check_stream_name
from ..domain.rights import Right
from ..log.access import OPEN_ACCESS, Access
from ..log.eventlog import EventLog
from ..quoting import quote_input
from .catalog import EventCatalog
from .message import NotifyError
from .selector import Selector

if TYPE_CHECKING:
    from ..domain.principal import Principal

#: Parsed events kept for subscribers at the head.
RING_EVENTS: Final = 8192
#: Events read from the store at once.
READ_BATCH: Final = 1000
#: Events the ring reads first when the head moves after it had caught up: the subscribers
#: get the first of a burst without waiting for the parse of a whole page.
FIRST_PAGE: Final = 200
#: Management events kept for a subscriber that does not take them; older ones are dropped.
MAX_PENDING_MANAGEMENT: Final = 1000


@dataclass(slots=True)
class _Interest:
    """What one registered subscriber may match (None: any type)."""

    types: frozenset[str] | None


@dataclass(slots=True)
class _Shared:
    """The matches of one selector among the ring's events in (``after``, ``to``], in id
    order: evaluated once for every subscriber of the ring that has the selector."""

    selector: Selector
    #: The log types it can match (None: any).
    types: frozenset[str] | None
    after: int
    to: int
    members: int = 0
    ids: list[int] = field(default_factory=list)
    matched: list[Notification] = field(default_factory=list)

    def restart(self, after: int) -> None:
        self.ids.clear()
        self.matched.clear()
        self.after = self.to = after

    def trim(self, up_to: int) -> None:
        """Forget the matches up to ``up_to`` (the ring dropped those events)."""
        if up_to > self.after:
            kept = bisect.bisect_right(self.ids, up_to)
            del self.ids[:kept], self.matched[:kept]
            self.after = min(up_to, self.to)

    def add(self, new: list[Notification], by_type: dict[str, list[Notification]], to: int) -> int:
        """Evaluate the ring's new events (``by_type``: the same by type), up to ``to``;
        returns how many were evaluated (those of its types)."""
        types = self.types
        if types is None:
            candidates = new
        elif len(types) == 1:
            (only,) = types
            candidates = by_type.get(only, [])
        else:
            candidates = [n for t in types for n in by_type.get(t, ())]
            candidates.sort(key=_id_of)
        matches = self.selector.matches_of_pinned
        for notification in candidates:
            if matches(notification):
                self.ids.append(_id_of(notification))
                self.matched.append(notification)
        self.to = to
        return len(candidates)

    def read(self, after_id: int, limit: int) -> tuple[list[Notification], int]:
        start = bisect.bisect_right(self.ids, after_id)
        result = self.matched[start : start + limit]
        if len(result) >= limit:
            return result, _id_of(result[-1])
        return result, self.to


class LiveEvents:
    """Parsed events of one log, shared by its subscribers."""

    def __init__(
        self, events: EventLog, catalog: EventCatalog | None = None, capacity: int = RING_EVENTS
    ) -> None:
        self.events = events
        self._partition = events.partition
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
        #: The last read reached the head: the next one starts with a short page.
        self._caught_up = True
        #: Each distinct selector of the subscribers, by its text.
        self._shared: dict[str, _Shared] = {}
        #: Events read from the store (all readers); what push-down saves shows here.
        self.rows_read = 0
        #: Selector evaluations (the ring's events: once per distinct selector).
        self.evaluations = 0
        #: Why the partition is no more (its stream was dropped); None while it is.
        self.ended: str | None = None
        self._on_end: set[Callable[[], None]] = set()

    def register(
        self, types: frozenset[str] | None, selector: Selector | None = None
    ) -> Callable[[], None]:
        """A subscriber that can match ``types`` only, with ``selector`` (evaluated once for
        all the subscribers that have it); returns how to unregister."""
        interest = _Interest(types)
        self._interests.append(interest)
        shared = None
        if selector is not None:
            shared = self._shared.get(selector.text)
            if shared is None:
                shared = _Shared(selector, types, self._to, self._to)
                self._shared[selector.text] = shared
            shared.members += 1

        def unregister() -> None:
            self._interests.remove(interest)
            if shared is not None:
                shared.members -= 1
                if not shared.members:
                    del self._shared[shared.selector.text]
            if not self._interests:  # no one reads the ring: its memory goes
                self._reset(-1)

        return unregister

    def on_end(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the reader is ended; returns how to stop."""
        self._on_end.add(callback)
        return lambda: self._on_end.discard(callback)

    def end(self, reason: str) -> None:
        """The partition is gone (``reason``, one sentence): the ring's memory goes and the
        subscribers are woken to learn it."""
        self.ended = reason
        self._reset(-1)
        for callback in list(self._on_end):
            callback()

    def _wanted_types(self) -> frozenset[str] | None:
        wanted: set[str] = set()
        for interest in self._interests:
            if interest.types is None:
                return None
            wanted |= interest.types
        return frozenset(wanted)

    async def read_matching(
        self,
        after_id: int,
        types: frozenset[str] | None,
        selector: Selector | None,
        limit: int = READ_BATCH,
    ) -> tuple[list[Notification], int]:
        """Events after ``after_id`` of ``types`` (any when None) that ``selector`` matches
        (all when None), at most ``limit``, and the id read up to. A selector registered
        here takes its matches from the shared result when that covers the position;
        otherwise the events are read (the ring, the store) and evaluated here."""
        if not await self._ready(after_id):
            return [], after_id
        if selector is None:
            return await self._read_ready(after_id, types, limit)
        shared = self._shared.get(selector.text)
        if shared is not None and shared.after <= after_id < shared.to:
            return shared.read(after_id, limit)
        read, reached = await self._read_ready(after_id, types, limit)
        self.evaluations += len(read)
        matches = selector.matches_of_pinned  # read has the pinned types only
        return [n for n in read if matches(n)], reached

    async def read(
        self, after_id: int, types: frozenset[str] | None, limit: int = READ_BATCH
    ) -> tuple[list[Notification], int]:
        """Events after ``after_id`` (of ``types`` when given), at most ``limit``, and the id
        read up to."""
        if not await self._ready(after_id):
            return [], after_id
        return await self._read_ready(after_id, types, limit)

    async def _ready(self, after_id: int) -> bool:
        """False when there is nothing after ``after_id``; else the ring has read past it
        when it can."""
        if after_id >= self.events.head:
            return False
        if after_id >= self._to:
            if after_id > self._to:  # ahead of the ring: start it here
                self._reset(after_id)
            await self._refill()
        return True

    async def _read_ready(
        self, after_id: int, types: frozenset[str] | None, limit: int
    ) -> tuple[list[Notification], int]:
        if self._from <= after_id < self._to and _within(types, self._ring_types):
            return self._from_ring(after_id, types, limit)
        events, reached = await self.events.read_of_types(after_id, limit, types)
        self.rows_read += len(events)
        return [Notification.of(event, self._partition) for event in events], reached

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
        self._caught_up = True
        for shared in self._shared.values():
            shared.restart(after_id)

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
        page = FIRST_PAGE if self._caught_up else READ_BATCH
        events, reached = await self.events.read_of_types(after, page, log_types)
        self.rows_read += len(events)
        partition = self._partition
        notifications = [Notification.of(event, partition) for event in events]
        if self._to != after:  # reset meanwhile: what was read belongs to no ring
            return
        self._caught_up = len(events) < page
        by_type = self._by_type
        new_by_type: dict[str, list[Notification]] = {}
        for notification in notifications:
            event_id = _id_of(notification)
            self._ids.append(event_id)
            self._ring.append(notification)
            of_type = by_type.get(notification.type)
            if of_type is None:
                of_type = by_type[notification.type] = ([], [])
            of_type[0].append(event_id)
            of_type[1].append(notification)
            new = new_by_type.get(notification.type)
            if new is None:
                new_by_type[notification.type] = [notification]
            else:
                new.append(notification)
        self._to = reached
        for shared in self._shared.values():  # each distinct selector once
            if shared.to == after:
                self.evaluations += shared.add(notifications, new_by_type, reached)
            else:  # cannot happen (each reset restarts them): start afresh rather than skip
                shared.restart(reached)
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
            for shared in self._shared.values():
                shared.trim(self._from)


_NONE: Final[tuple[list[int], list[Notification]]] = ([], [])


def _id_of(notification: Notification) -> int:
    assert notification.id is not None  # events of the log have ids
    return notification.id


def _within(types: frozenset[str] | None, ring_types: frozenset[str] | None) -> bool:
    if ring_types is None:
        return True
    return types is not None and types <= ring_types


@dataclass(slots=True)
class _Cursor:
    """Where a subscription is in one partition."""

    live: LiveEvents
    after_id: int


class Subscription:
    """One subscriber: matching notifications after its positions, as :meth:`next` is called.

    It reads one partition (``live``, after ``after_id``) or, with ``more``, every partition
    of a stream: each in id order, the partitions taken in turns; with ``grows``, also the
    partitions the stream gets later, from their first event. ``management`` is a filter on
    the management events this subscriber may see at all (its user's own, say); None: none
    at all.
    """

    def __init__(
        self,
        live: LiveEvents,
        bus: ManagementBus | None,
        selector: Selector | None,
        after_id: int,
        management: Callable[[Notification], bool] | None = None,
        *,
        more: Sequence[tuple[LiveEvents, int]] = (),
        grows: StreamPartitions | None = None,
    ) -> None:
        self.bus = bus
        self.selector = selector
        self.management = management
        #: Management events dropped because the subscriber did not take them in time.
        self.dropped = 0
        #: Set when there may be more to read (doors also set it when they can send again).
        self.wake = asyncio.Event()
        self._cursors = [_Cursor(live, after_id), *(_Cursor(other, at) for other, at in more)]
        #: The partition read first in the next turn.
        self._turn = 0
        self._pending: deque[Notification] = deque()
        self._stops: list[Callable[[], None]] = []
        self._log_types: frozenset[str] | None = None
        self._reads_log = True
        self._grows = grows
        #: The stream's registry changed since its partitions were last counted.
        self._changed = False

    @classmethod
    def of_partitions(
        cls,
        positions: Sequence[tuple[LiveEvents, int]],
        bus: ManagementBus | None,
        selector: Selector | None,
        management: Callable[[Notification], bool] | None = None,
        grows: StreamPartitions | None = None,
    ) -> Subscription:
        """Over several partitions: (their shared reader, the id to start after) each."""
        (live, after_id), *more = positions
        return cls(live, bus, selector, after_id, management, more=more, grows=grows)

    @property
    def live(self) -> LiveEvents:
        """The (first) partition's shared reader."""
        return self._cursors[0].live

    @property
    def after_id(self) -> int:
        """Everything of the (first) partition up to this id has been read."""
        return self._cursors[0].after_id

    @property
    def positions(self) -> list[int]:
        """What every partition has been read up to, in partition order."""
        return [cursor.after_id for cursor in self._cursors]

    @property
    def gone(self) -> UnknownStream | None:
        """Why the subscription cannot go on (its stream was dropped), or None."""
        for cursor in self._cursors:
            if cursor.live.ended is not None:
                return UnknownStream(cursor.live.ended)
        return None

    def start(self) -> Subscription:
        for cursor in self._cursors:
            self._stops.append(cursor.live.on_end(self.wake.set))
        pinned = self.selector.event_types if self.selector is not None else None
        if pinned is not None:
            self._log_types = frozenset(t for t in pinned if not is_management_type(t))
            self._reads_log = bool(self._log_types)
        if self._reads_log:
            for cursor in self._cursors:
                self._follow(cursor)
            if self._grows is not None:
                self._stops.append(self._grows.listen(self._registry_changed))
        wants_management = pinned is None or any(is_management_type(t) for t in pinned)
        if self.bus is not None and self.management is not None and wants_management:
            self._stops.append(self.bus.listen(self._on_management))
        return self

    def _follow(self, cursor: _Cursor) -> None:
        self._stops.append(cursor.live.register(self._log_types, self.selector))
        self._stops.append(cursor.live.events.listen(self.wake.set))

    def _registry_changed(self) -> None:
        self._changed = True
        self.wake.set()

    def _grow(self) -> None:
        """Read the partitions the stream has gained from their start."""
        self._changed = False
        assert self._grows is not None
        try:
            lives = self._grows.current()
        except UnknownStream:  # dropped: its readers are ended, and so is the subscription
            return
        for live in lives[len(self._cursors) :]:
            cursor = _Cursor(live, 0)
            self._cursors.append(cursor)
            self._stops.append(live.on_end(self.wake.set))
            self._follow(cursor)

    def close(self) -> None:
        for stop in self._stops:
            stop()
        self._stops.clear()
        self._grows, self._changed = None, False

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

    def _behind(self) -> bool:
        if self._changed:
            self._grow()
        return self._reads_log and any(c.live.events.head > c.after_id for c in self._cursors)

    def has_more(self) -> bool:
        """Whether :meth:`poll` has something to give now (or its end to raise)."""
        return bool(self._pending) or self.gone is not None or self._behind()

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
        management events, then log events from one read of each partition behind.
        :class:`UnknownStream` once the stream is dropped."""
        gone = self.gone
        if gone is not None:
            raise gone
        batch = self.take_pending(limit)
        if len(batch) < limit and self._behind():
            batch.extend(await self.read_log(limit - len(batch)))
        return batch

    def take_pending(self, limit: int) -> list[Notification]:
        pending = self._pending
        return [pending.popleft() for _ in range(min(limit, len(pending)))]

    async def read_log(self, limit: int) -> list[Notification]:
        """Matching log events from one read of each partition that is behind (the first
        one in turn), at most ``limit``; moves the positions on."""
        cursors = self._cursors
        count = len(cursors)
        start = self._turn
        self._turn = (start + 1) % count
        result: list[Notification] = []
        for step in range(count):
            if len(result) >= limit:
                break
            cursor = cursors[(start + step) % count]
            if cursor.live.events.head <= cursor.after_id:
                continue
            read, reached = await cursor.live.read_matching(
                cursor.after_id, self._log_types, self.selector, limit - len(result)
            )
            cursor.after_id = reached
            result.extend(read)
        return result


class UnknownStream(NotifyError):
    """A subscription or GET-EVENTS names no stream this server has (or no possible name)."""


@dataclass(frozen=True, slots=True)
class StreamPartitions:
    """One stream's partitions as it grows: ``current()`` gives their readers now (or raises
    :class:`UnknownStream`), ``listen(callback)`` calls back on each change of the registry
    and returns how to stop."""

    current: Callable[[], list[LiveEvents]]
    listen: Callable[[Callable[[], None]], Callable[[], None]]


class LiveStreams:
    """The shared reader (:class:`LiveEvents`) of every partition that subscribers read,
    made when one first asks for it and kept until its stream is dropped: one store read and
    one parse per event and partition, however many subscribe. A partition's ring holds
    events only while it has subscribers, and a stream's rings together about
    :data:`RING_EVENTS`."""

    def __init__(
        self,
        default: LiveEvents,
        stream: Callable[[str], StreamInfo | None],
        event_log: Callable[[Partition], EventLog],
        listen: Callable[[Callable[[], None]], Callable[[], None]] | None = None,
        access: Access = OPEN_ACCESS,
        typed: Callable[[str], list[tuple[str, list[str]]]] | None = None,
    ) -> None:
        """``default``: the reader of ``events``/0; ``stream`` looks a stream up
        (``server.streams.get``; ``events`` is ``default`` alone when it does not know it);
        ``event_log`` gives the log of a partition; ``listen`` hears of registry changes
        (``server.streams.listen``; None: subscriptions do not follow a stream's growth, nor
        its drop);
        ``access``: who may read which stream (``server.access``); ``typed``: the event
        types of a stream that have a schema, with the attributes it names
        (``server.schemas.attributes``)."""
        self.default = default
        self.access = access
        self._typed = typed
        self._stream = stream
        self._event_log = event_log
        self._listen = listen
        self._lives: dict[int, LiveEvents] = {default.events.partition.key: default}
        if listen is not None:
            listen(self._registry_changed)

    @property
    def readers(self) -> int:
        """The shared readers held now (``events``/0's among them)."""
        return len(self._lives)

    def _registry_changed(self) -> None:
        """End and forget the readers of the partitions the registry no longer has."""
        for key, live in list(self._lives.items()):
            partition = live.events.partition
            if live is self.default:
                continue
            info = self._stream(partition.stream)
            if info is not None and partition in info.partitions:
                continue
            del self._lives[key]
            live.end(f"the stream {partition.stream} was dropped")

    def of_stream(self, name: str | None, who: Principal | None = None) -> list[LiveEvents]:
        """The readers of the partitions of stream ``name`` (None: ``events``), in partition
        order; :class:`UnknownStream` when there is none of that name. With ``who``: first
        :class:`~futoin_evt.log.access.AccessDenied` unless they may read the stream."""
        if name is None:
            name = DEFAULT_STREAM
        try:
            check_stream_name(name)
        except ValueError as exc:
            raise UnknownStream(str(exc)) from None
        if who is not None:
            self.access.check(who, Right.READ, name)
        info = self._stream(name)
        if info is None:
            if name == DEFAULT_STREAM:
                return [self.default]
            raise UnknownStream(f"there is no stream {name}")
        capacity = max(RING_EVENTS // len(info.partitions), 2 * READ_BATCH)
        return [self._live(partition, capacity) for partition in info.partitions]

    def growing(self, name: str | None) -> StreamPartitions | None:
        """How a subscription to ``name`` follows the partitions it gains."""
        if self._listen is None:
            return None
        return StreamPartitions(lambda: self.of_stream(name), self._listen)

    def _live(self, partition: Partition, capacity: int) -> LiveEvents:
        live = self._lives.get(partition.key)
        if live is None:
            live = LiveEvents(self._event_log(partition), capacity=capacity)
            self._lives[partition.key] = live
        return live

    def watch(
        self, who: Principal, stream: str | None, on_revoked: Callable[[], None]
    ) -> Callable[[], None]:
        """Call ``on_revoked`` once ``who`` may no longer read ``stream`` (None: ``events``);
        returns how to stop watching."""
        return self.access.watch(who, Right.READ, stream or DEFAULT_STREAM, on_revoked)

    async def event_types(
        self, stream: str | None, event_type: str | None = None, who: Principal | None = None
    ) -> dict[str, list[str]]:
        """GET-EVENTS over every partition of a stream: event type -> attribute names (with
        ``who``: :class:`~futoin_evt.log.access.AccessDenied` unless they may read it)."""
        lives = self.of_stream(stream, who)
        merged: dict[str, dict[str, None]] = {}
        if self._typed is not None:  # a typed event's attributes as its schema names them
            for name, attributes in self._typed(stream or DEFAULT_STREAM):
                if event_type is None or name == event_type:
                    merged[name] = dict.fromkeys((*BASE_ATTRIBUTES, *attributes))
        for live in lives:
            for name, attributes in (await live.catalog.event_types(event_type)).items():
                merged.setdefault(name, {}).update(dict.fromkeys(attributes))
        return {name: list(attributes) for name, attributes in merged.items()}


def start_positions(lives: Sequence[LiveEvents], after: str | None) -> list[int]:
    """Where a subscription over ``lives`` starts: after the newest event of each (``after``
    None), or after the ids ``after`` names, one per partition in partition order separated
    by commas (``"12,0,7,3"``); a single id for a stream of one partition. NotifyError when
    they do not fit."""
    if after is None:
        return [live.events.head for live in lives]
    parts = after.split(",")
    if len(parts) != len(lives) or not all(p.isdigit() and len(p) <= 19 for p in parts):
        raise NotifyError(
            f"after names one id per partition, {len(lives)} here, separated by commas:"
            f" not {quote_input(after, 60)}"
        )
    return [int(part) for part in parts]


def management_visible_to(
    principal: Principal, access: Access | None = None
) -> Callable[[Notification], bool]:
    """Which management events a user may see: an admin all; others those about themselves
    (their ``user``). With ``access``, an event about a stream only when they may read it,
    and then also those about other users' consumers when they may manage it."""
    if principal.is_admin:
        return lambda _n: True
    name = principal.name
    if access is None:
        return lambda n: type(n.data) is dict and n.data.get("user") == name

    def visible(n: Notification) -> bool:
        own = type(n.data) is dict and n.data.get("user") == name
        stream = n.stream
        if stream is None:
            return own
        return access.allows(principal, Right.READ, stream) and (
            own or access.allows(principal, Right.MANAGE, stream)
        )

    return visible
