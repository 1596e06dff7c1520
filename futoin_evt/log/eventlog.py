"""One partition's events as every door calls them: the one way down to the store.

Append, read after a position, learn when the head moves, bounds and time lookup, the DCB
calls, the registered consumers (:attr:`EventLog.consumers`) and the holds of AMQP consumer
groups. Each call a door makes on
a user's behalf takes that user (``who``) first: rights on the stream are checked there, in
``log/`` (:mod:`.access`), and each door maps a refusal to its wire. What the server reads
for itself (the notification's shared reader, a sampler of heads) takes no user.

Every door appends through :meth:`EventLog.append`, which checks the rules of an event, the
producers' keys and the schema of each event type on the stream, when the type has one
(:mod:`.schemas`: one dictionary lookup per event, the data's check only for a typed event),
before anything of the call is queued. What a call fails with is one of the kinds of
:mod:`.errors`, which each door maps to its wire with one table.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Final, cast, overload

from ..domain.dcb import AppendCondition, NewEvent, Query, SequencedEvent
from ..domain.groups import GroupClaim, GroupHold
from ..domain.partition import Partition
from ..domain.principal import Principal
from ..domain.rights import Right
from ..domain.stream import (
    MAX_EVENTS_PER_CALL,
    EventDraft,
    EventId,
    EventRejected,
    StoredEvent,
    UserId,
    check_event_key,
    encode_event_data,
    stored_form,
    utc_timestamp,
)
from ..storage.base import DiscardLimits, EventPage, PartitionLog, StreamBounds
from ..storage.dedup import WriterKey
from ..storage.errors import DamagedEvent, NotWritable, StoreUnreachable
from .access import OPEN_ACCESS, StreamGuard
from .consumers import ConsumerLifecycle, PartitionConsumers
from .schemas import TypeSchema

__all__ = [
    "DamagedEvent",
    "DiscardLimits",
    "EventLog",
    "EventPage",
    "NotWritable",
    "StoreUnreachable",
    "StreamBounds",
]

#: A store row (id, type, data JSON, ts, content type, attrs) as a :class:`StoredEvent`.
_make_event: Final = StoredEvent._make

#: The schema events of a type are checked against on a stream (``server.schemas.schema_of``).
SchemaOf = Callable[[str, str], TypeSchema | None]


def _last_id(ids: asyncio.Future[list[EventId]]) -> asyncio.Future[EventId]:
    """The future of the last of ``ids`` (one callback for the whole append)."""
    last: asyncio.Future[EventId] = ids.get_loop().create_future()

    def settle(done: asyncio.Future[list[EventId]]) -> None:
        if last.done():
            return
        if done.cancelled():
            last.cancel()
        elif (exc := done.exception()) is not None:
            last.set_exception(exc)
        else:
            last.set_result(done.result()[-1])

    ids.add_done_callback(settle)
    return last


def _unchecked(_stream: str, _event_type: str) -> None:
    """No event type has a schema (a log the server reads for itself, a unit test)."""


class EventLog:
    """One ordered log (a partition of a stream): what a door calls instead of the store."""

    def __init__(
        self,
        store: PartitionLog,
        lifecycle: ConsumerLifecycle | None = None,
        guard: StreamGuard | None = None,
        schema_of: SchemaOf | None = None,
    ) -> None:
        """``guard``: the rights checks of the stream (everything allowed when not given:
        a log the server reads for itself); ``schema_of``: the schemas appends meet (none when
        not given)."""
        self._store = store
        self._stream = store.partition.stream
        self._schema_of = schema_of or _unchecked
        #: Appends need write on the stream; reads, bounds and times need read.
        self.guard = guard = guard or StreamGuard(OPEN_ACCESS, store.partition.stream)
        #: The partition's registered consumers.
        self.consumers = PartitionConsumers(
            store, lifecycle if lifecycle is not None else ConsumerLifecycle(), guard
        )

    @property
    def partition(self) -> Partition:
        return self._store.partition

    # -- appends ----------------------------------------------------------------------------

    @overload
    def append(
        self,
        who: Principal,
        events: Sequence[EventDraft],
        *,
        keys: Sequence[object] | None = None,
    ) -> asyncio.Future[EventId]: ...
    @overload
    def append(
        self,
        who: Principal,
        events: Sequence[NewEvent],
        *,
        condition: AppendCondition | None = None,
    ) -> Awaitable[int]: ...
    def append(
        self,
        who: Principal,
        events: Sequence[EventDraft] | Sequence[NewEvent],
        *,
        keys: Sequence[object] | None = None,
        condition: AppendCondition | None = None,
    ) -> Awaitable[int]:
        """The one way every door appends: the write right, each event's rules (its type,
        size and JSON: :func:`~futoin_evt.domain.stream.stored_form`; a DCB event's are
        checked where it is made, :func:`~futoin_evt.domain.dcb.new_event`), the producers'
        ``keys`` (one per event, None for none; as a producer sent them, so of any type), each
        typed event's schema, and a DCB
        ``condition``. Nothing of the call is queued unless all of them pass; then the events
        are stored in one transaction, all or none. The awaitable gives the id of the last
        event once every one is durable.

        A producer's key is its writer's: within the partition's dedup window, an event
        whose key from ``who`` is stored (or being stored) stores nothing and answers with
        the first event's id (see :meth:`~futoin_evt.storage.base.EventLog.submit_append`).

        DCB events (:class:`~futoin_evt.domain.dcb.NewEvent`) go with their tags, ids and
        ``condition`` to :meth:`~futoin_evt.storage.base.DcbLog.dcb_append`, which checks the
        condition in the write transaction.

        Raises, before anything is queued: :class:`~futoin_evt.log.access.Refused`,
        :class:`~futoin_evt.domain.stream.EventRejected` (the schema's
        :class:`~futoin_evt.domain.schemas.EventDataInvalid` too), :class:`NotWritable` for an
        aggregated stream; see :mod:`.errors` for what a door answers."""
        self.guard.write(who)
        if not events:
            raise EventRejected("an append needs at least one event")
        if type(events[0]) is NewEvent:
            dcb_events = cast("Sequence[NewEvent]", events)
            self._check_encoded([(event.type, event.data_json) for event in dcb_events])
            return self._store.dcb_append(dcb_events, condition)
        if condition is not None:
            raise TypeError("an append condition needs DCB events")
        drafts = cast("Sequence[EventDraft]", events)
        writer_keys = None
        if keys is not None:
            writer = who.user_id
            writer_keys = [
                None if key is None else WriterKey(writer, check_event_key(key)) for key in keys
            ]
        if len(drafts) == 1:
            draft = drafts[0]
            if draft.text is None and draft.content_type is None and draft.attrs is None:
                # FTN18's addEvent
                data_json = encode_event_data(draft.type, draft.data)
                schema = self._schema_of(self._stream, draft.type)
                if schema is not None:
                    schema.check(draft.type, draft.data)
                return self._store.submit_append(
                    draft.type, data_json, None, writer_keys[0] if writer_keys else None
                )
        stored = [stored_form(draft) for draft in drafts]
        self._check_encoded([(event[0], event[1]) for event in stored])
        if len(stored) == 1:
            event_type, data_json, content_type, attrs = stored[0]
            return self._store.submit_append(
                event_type, data_json, content_type, writer_keys[0] if writer_keys else None, attrs
            )
        return _last_id(self._store.submit_appends(stored, writer_keys))

    def _check_encoded(self, events: Sequence[tuple[str, str]]) -> None:
        """Each (type, data JSON) of one call against its type's schema, if it has one."""
        schema_of, stream = self._schema_of, self._stream
        count = len(events)
        for index, (event_type, data_json) in enumerate(events):
            schema = schema_of(stream, event_type)
            if schema is not None:
                schema.check(
                    event_type, json.loads(data_json), (index, count) if count > 1 else None
                )

    # -- reads ------------------------------------------------------------------------------

    async def read_page(
        self,
        who: Principal,
        after_id: int,
        *,
        types: Sequence[str] | None = None,
        limit: int = MAX_EVENTS_PER_CALL,
        max_bytes: int,
        ftn18_only: bool = False,
        up_to_head: bool = False,
    ) -> EventPage:
        """Events after ``after_id`` encoded as FTN18's JSON array, as many as fit ``limit``
        and ``max_bytes``: every event acknowledged before the call, on any worker or process;
        with ``up_to_head``, only those up to :attr:`head`, for a reader the head wakes (see
        :meth:`~futoin_evt.storage.base.EventLog.read_events`)."""
        self.guard.read(who)
        return await self._store.read_events(
            after_id,
            types=types,
            limit=limit,
            max_bytes=max_bytes,
            ftn18_only=ftn18_only,
            up_to_head=up_to_head,
        )

    def read_recent_page(
        self,
        who: Principal,
        after_id: int,
        *,
        types: Sequence[str] | None = None,
        max_bytes: int,
        ftn18_only: bool = False,
    ) -> EventPage | None:
        """:meth:`read_page` with ``up_to_head`` when the recent events answer it, at once
        (a push stream sends from the commit's loop turn); None when the store must be read."""
        self.guard.read(who)
        return self._store.read_recent(
            after_id, types=types, max_bytes=max_bytes, ftn18_only=ftn18_only
        )

    async def read_after(self, who: Principal, after_id: int, limit: int) -> list[StoredEvent]:
        self.guard.read(who)
        rows = await self._store.read_rows(after_id, limit=limit)
        return list(map(_make_event, rows))

    async def read_of_types(
        self, after_id: int, limit: int, types: Collection[str] | None
    ) -> tuple[list[StoredEvent], int]:
        """The shared reader's (the notification's, for every subscriber): events after
        ``after_id`` (of ``types`` only, when given: the store reads no others), and the id
        read up to: past the events the filter left out, so the next read starts there."""
        head = self.head  # committed before the read starts, so the read sees all up to it
        wanted = sorted(set(types)) if types is not None else None
        rows = await self._store.read_rows(after_id, limit=limit, types=wanted)
        events = list(map(_make_event, rows))
        if len(events) >= limit:
            return events, events[-1].id
        return events, max(head, events[-1].id if events else after_id)

    async def dcb_read(
        self, who: Principal, query: Query, *, after: int | None, before: int | None, limit: int
    ) -> tuple[list[SequencedEvent], int]:
        """Events matching ``query`` after ``after``, or before ``before`` newest first, and
        the newest position given (see :meth:`~futoin_evt.storage.base.DcbLog.dcb_read`)."""
        self.guard.read(who)
        return await self._store.dcb_read(query, after=after, before=before, limit=limit)

    # -- the head, bounds and times ---------------------------------------------------------

    @property
    def head(self) -> int:
        """The newest committed event id known to this process."""
        return self._store.head.head

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` whenever :attr:`head` moves; returns how to stop."""
        return self._store.head.listen(callback)

    async def wait_beyond(self, event_id: int) -> None:
        """Until :attr:`head` is past ``event_id``."""
        await self._store.head.wait_beyond(event_id)

    async def newest_id(self) -> int:
        """The newest stored event's id, read from the database (0 when there is none)."""
        return await self._store.newest_event_id()

    async def catch_up(self) -> None:
        """Move :attr:`head` to the newest id in the database (what other processes added
        before this one listened)."""
        self._store.head.advance(await self._store.newest_event_id())

    async def last_given_id(self, who: Principal) -> int:
        """The newest id ever given to an event, even if that event is discarded."""
        self.guard.read(who)
        return await self._store.last_given_id()

    async def bounds(self, who: Principal) -> StreamBounds:
        self.guard.read(who)
        return await self._store.stream_bounds()

    async def retention_limits(self, who: Principal) -> DiscardLimits:
        """The newest and oldest ids and the lowest consumer position, in one snapshot."""
        self.guard.read(who)
        return await self._store.discard_limits(None)

    async def id_before(self, who: Principal, ts: str) -> int | None:
        """The newest id before the first event at or after ``ts`` (``YYYY-MM-DDTHH:MM:SSZ``);
        None when that is the oldest retained event (or there are none)."""
        self.guard.read(who)
        return await self._store.id_before(ts)

    async def id_before_ms(self, who: Principal, timestamp_ms: int) -> int:
        """The position to read after for events added after ``timestamp_ms``.

        Stored times have whole seconds, so an event added in the second of the instant is
        treated as added at its start (not after it).
        """
        self.guard.read(who)
        first_second_after = timestamp_ms // 1000 + 1
        before = await self._store.id_before(utc_timestamp(first_second_after))
        return before if before is not None else 0

    # -- AMQP consumer groups (one link per user, group and partition in the whole cluster) -
    # A group is its user's: claiming it, holding it and acknowledging through it need read on
    # the stream; releasing it does not (a link whose right went lets its group go).

    async def claim_group(
        self,
        who: Principal,
        group: str,
        epoch: int | None,
        *,
        hold_seconds: float,
        equal_takes_over: bool = False,
        free_only: bool = False,
    ) -> GroupClaim:
        """Take ``who``'s group for a new link (see
        :meth:`~futoin_evt.storage.base.ConsumerGroups.claim_group`)."""
        self.guard.read(who)
        return await self._store.claim_group(
            who.user_id,
            group,
            epoch,
            hold_seconds=hold_seconds,
            equal_takes_over=equal_takes_over,
            free_only=free_only,
        )

    async def hold_groups(
        self, holds: Sequence[tuple[Principal, str, int]], hold_seconds: float
    ) -> list[GroupHold]:
        """Renew the holds (user, group, claim number); returns those another claim took.
        The hold of a user who may no longer read the stream is not renewed (its link ends
        as its right goes, and the hold runs out)."""
        kept = [(who.user_id, group, claim) for who, group, claim in holds if self._reads(who)]
        return await self._store.hold_groups(kept, hold_seconds) if kept else []

    def _reads(self, who: Principal) -> bool:
        guard = self.guard
        return guard.access.allows(who, Right.READ, guard.stream)

    async def release_group(self, who: Principal, group: str, claim: int) -> None:
        await self._store.release_group(who.user_id, group, claim)

    async def acknowledge_group(
        self, who: Principal, group: str, claim: int, component: str, up_to: int
    ) -> int | None:
        """:meth:`acknowledge` of ``who``'s consumer, fenced by the group's claim: None once
        another claim took it (or the consumer is not registered);
        :class:`~futoin_evt.log.consumers.PositionPastHead` past the head."""
        self.guard.read(who)
        await self.consumers.within_head(up_to)
        return await self._store.acknowledge_group(who.user_id, group, claim, component, up_to)

    def listen_group_claims(
        self, callback: Callable[[UserId, str, int, int], None]
    ) -> Callable[[], None]:
        """Call ``callback(user, group, claim, epoch)`` when a group is taken, by another
        process (or, on PostgreSQL, this one); returns how to stop."""
        return self._store.claims.listen_groups(callback)


def retrieve_quietly(page: asyncio.Future[Any]) -> None:
    """Done callback of a page read ahead: one nobody takes may fail unnoticed (its reader
    reads again), and is not logged as an exception never retrieved."""
    if not page.cancelled():
        page.exception()
