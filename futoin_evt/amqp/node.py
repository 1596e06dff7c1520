"""The event log nodes: one per stream, under its name, with partitions ``"0".."P-1"``, and
their ``$info`` sources.

A link is taken by :meth:`EventLogNode.attach`, which checks the caller's right on the
stream (write to send, read to receive; before anything tells whether the stream exists),
the address and the link properties, and returns the handler that then serves it:
:class:`ProducerLink` for messages sent to a stream, :class:`ConsumerLink` for events read
from one partition, :class:`PartitionsLink` for events read from all of them
(partition-agnostic), :class:`InfoLink` for the runtime information. Handlers call the event
logs of the partitions, never the store.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import zlib
from collections import deque
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from ..domain.groups import GroupClaim, GroupHold
from ..domain.rights import Right
from ..domain.stream import EventRejected, StoredEvent, UserId, check_event_key, is_registrable
from ..domain.termini import KeptTermini
from ..log.access import Refused
from ..log.consumers import PositionPastHead
from ..log.eventlog import EventLog, retrieve_quietly
from ..quoting import quote_input
from ..stats import Calls
from .codec import (
    BATCH_FORMAT,
    DELIVERY_ANNOTATIONS_FILTER,
    SELECTOR_FILTER,
    SQL_FILTER,
    BadFilter,
    BadMessage,
    EventEncoder,
    Position,
    batch_messages,
    delivery_annotations_start,
    described_filter,
    filter_kind,
    format_offset,
    message_to_event,
    stored_form,
)
from .config import DEFAULT_NODE_LIMITS, NodeLimits
from .engine.connection import Delivery, Link
from .engine.message import Message, decode_message
from .engine.performatives import (
    Accepted,
    Modified,
    Received,
    Rejected,
    Released,
    Source,
    from_described,
)
from .engine.types import DecodeError, Described, Symbol, decode_value, encode
from .filters import compile_filter
from .links import INTERNAL_ERROR, PARTITION_PROPERTY, SourceLink, link_answer
from .quickdecode import quick_event
from .resume import MAX_TIMEOUT, MAX_UNSETTLED, KeptTerminus, Termini, TerminusKey
from .table import UNAUTHORIZED, Connection, Hubs, LinkHandler, LinkRefused, address_path

log = logging.getLogger(__name__)

NODE: Final = "events"
INFO: Final = "$info"
PARTITION: Final = "0"
#: Delivery annotations: the partition a producer's message goes to, a consumer's came from.
TARGET_PARTITION: Final = Symbol("event-streams-target-partition")
SOURCE_PARTITION: Final = Symbol("event-streams-source-partition")
#: Message annotations naming a partition key (Event Hubs', and the event streams draft's).
PARTITION_KEYS: Final = (Symbol("x-opt-partition-key"), Symbol("event-streams-group-key"))
GROUP_PROPERTY: Final = Symbol("event-streams-consumer-group")
EPOCH_PROPERTY: Final = Symbol("event-streams-epoch")
#: Event Hubs' epoch (the SDK's ``owner_level``; 0 with a checkpoint store).
OWNER_LEVEL_PROPERTY: Final = Symbol("com.microsoft:epoch")
#: A consumer group named ``ftn18:<component>`` keeps its position as the user's registered
#: FTN18 consumer ``<component>`` (registered on attach if need be).
FTN18_GROUP_PREFIX: Final = "ftn18:"
MAX_GROUP_CHARS: Final = 256
#: Event Hubs' default consumer group: in an address, the same as no group.
DEFAULT_GROUP: Final = "$Default"
#: Events read from the store for a consumer at once (less when its credit is lower).
READ_BATCH: Final = 1000
#: How long a consumer group's hold lasts unless its process renews it: the groups of a
#: process that died stay held this long at most (a higher epoch, or an equal Event Hubs
#: owner level, takes one over at once).
GROUP_HOLD_SECONDS: Final = 30.0
#: How often a process renews the holds of its groups' links.
GROUP_RENEW_SECONDS: Final = GROUP_HOLD_SECONDS / 3
#: How long closing waits for the groups of ended links to be released.
GROUP_RELEASE_SECONDS: Final = 5.0

_ENCODER: Final = EventEncoder()

NOT_FOUND: Final = "amqp:not-found"
INVALID_FIELD: Final = "amqp:invalid-field"
DECODE_ERROR: Final = "amqp:decode-error"
MESSAGE_SIZE_EXCEEDED: Final = "amqp:link:message-size-exceeded"
LINK_STOLEN: Final = "amqp:link:stolen"
RESOURCE_LOCKED: Final = "amqp:resource-locked"
DETACH_FORCED: Final = "amqp:link:detach-forced"
PRECONDITION_FAILED: Final = "amqp:precondition-failed"
NOT_ALLOWED: Final = "amqp:not-allowed"
#: Terminus expiry policies (AMQP 3.5.6).
LINK_DETACH: Final = "link-detach"
SESSION_END: Final = "session-end"
CONNECTION_CLOSE: Final = "connection-close"
NEVER: Final = "never"
#: A peer's unsettled map with more entries than this is refused.
MAX_PEER_UNSETTLED: Final = MAX_UNSETTLED
_STATES: Final = (Accepted, Rejected, Released, Modified, Received)
#: A tag the peer's unsettled map does not have.
_ABSENT: Final = object()


def key_partition(key: str, count: int) -> int:
    """The partition of a partition key: CRC-32 (IEEE 802.3, as zlib's) of its UTF-8 bytes,
    modulo the partition count. The same key, the same partition while the count stays."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % count


class OneHub:
    """Only ``events``, with one partition."""

    def __init__(self, events: EventLog) -> None:
        self._logs = (events,)

    def partitions(self, name: str) -> Sequence[EventLog] | None:
        return self._logs if name == NODE else None

    def listen(self, callback: Callable[[], None]) -> Callable[[], None]:
        return lambda: None  # one partition, for good


#: A consumer group of a user on a partition: (partition key, user, group).
_GroupKey = tuple[int, UserId, str]


@dataclass(slots=True)
class _Owner:
    """The active receive link of a consumer group on a partition in this process, with
    its epoch and its claim number."""

    epoch: int
    claim: int
    conn: Connection
    link: Link
    events: EventLog


@dataclass(frozen=True, slots=True)
class _Address:
    """What an address names: a stream, its partitions' logs, and perhaps a consumer group,
    a partition, or the ``$info`` source."""

    hub: str
    logs: Sequence[EventLog]
    group: str | None = None
    partition: int | None = None
    info: bool = False


class EventLogNode:
    """Routes attaches to the handlers of the streams' event logs."""

    def __init__(
        self,
        events: EventLog,
        limits: NodeLimits = DEFAULT_NODE_LIMITS,
        hubs: Hubs | None = None,
        *,
        termini: KeptTermini,
    ) -> None:
        """``termini``: where the termini of suspended links are kept (the database every
        process on it shares)."""
        self.events = events
        self.hubs: Hubs = hubs if hubs is not None else OneHub(events)
        self.limits = limits
        #: Messages sent to the node, by outcome, with the time to their settlement (metrics).
        self.calls = Calls("amqp")
        #: This process's active group links. The database says which link holds a group
        #: (:meth:`EventLog.claim_group`); a claim heard of detaches the older link here.
        self._groups: dict[_GroupKey, _Owner] = {}
        #: Claims on their way, and the newest claim heard of the group meanwhile.
        self._claiming: dict[_GroupKey, int] = {}
        self._heard: dict[_GroupKey, int] = {}
        #: Groups of ended links until their release is stored.
        self._releasing: dict[_GroupKey, asyncio.Future[None]] = {}
        #: Partition key -> how to stop hearing its group claims.
        self._listening: dict[int, Callable[[], None]] = {}
        #: Renews the holds while there are group links here.
        self._renewing: asyncio.Future[None] | None = None
        #: Where messages with no partition key go, in turn.
        self._spread = itertools.count()
        #: The termini of suspended durable consumer links, until they expire.
        self.termini = Termini(termini)

    def attach(self, conn: Connection, link: Link) -> LinkHandler:
        """The handler for a new link, or :class:`LinkRefused`: ``amqp:unauthorized-access``
        without the right on the stream its address names (write to send to it, read to
        receive from it), before anything tells whether the stream exists."""
        address = link.address
        uri = address is not None and "://" in address
        address = address_path(address) if address is not None else ""
        stream = address.partition("/")[0]
        conn.authorize(link, Right.READ if link.is_sender else Right.WRITE, stream, (address,))
        parsed = self._parse_address(address)
        properties = _link_properties(link)
        partition = _requested_partition(properties, parsed)
        if parsed.info:
            if not link.is_sender:
                raise LinkRefused(NOT_FOUND, "$info is a source: attach a receiving link")
            return InfoLink(conn, link, parsed.logs)
        if partition is None and len(parsed.logs) == 1:
            partition = 0  # the node binds a link of a one-partition stream (4.1, 4.3)
        if not link.is_sender:
            return ProducerLink(
                conn,
                link,
                parsed.logs[partition] if partition is not None else self.events,
                self.limits,
                self.calls,
                router=None if partition is not None else self._router(parsed.hub),
                partition=partition,
            )
        group = properties.get(GROUP_PROPERTY, parsed.group)
        epoch = properties.get(EPOCH_PROPERTY)
        # An Event Hubs owner level: one link per group and partition, the newest of the
        # highest level wins (how the SDK's load balancing hands a partition over).
        owner_level = properties.get(OWNER_LEVEL_PROPERTY) if epoch is None else None
        if owner_level is not None:
            group = DEFAULT_GROUP if group is None else group
            epoch = owner_level
        event_hubs = uri or parsed.partition is not None
        if group is None:
            if partition is None:
                starts = [_start_position(link, events.head) for events in parsed.logs]
                return PartitionsLink(
                    conn,
                    link,
                    parsed.logs,
                    starts,
                    event_hubs=event_hubs,
                    grows=self._grows(parsed.hub),
                )
            events = parsed.logs[partition]
            head = events.head
            start = _start_position(link, head)
            recovery = self._durability(conn, link, None)
            if recovery is None or not recovery.durable:
                self._forget(recovery)
                return ConsumerLink(conn, link, events, start, event_hubs=event_hubs,
                                    partition=partition)  # fmt: skip
            return _Attaching(
                conn,
                link,
                lambda attaching: self._attach_durable(
                    attaching, recovery, events, start, head, event_hubs, partition
                ),
                "the link's terminus could not be read",
            )
        return self._attach_group(
            conn, link, parsed, partition, group, epoch, event_hubs, owner_level is not None
        )

    def _durability(self, conn: Connection, link: Link, group: str | None) -> Recovery | None:
        """The durability granted to a consumer link of ``group`` (durable 0: none), or
        None when the link has no source (or no user or container id: nothing to find it
        by); :class:`LinkRefused` for a bad expiry policy or unsettled map."""
        peer_unsettled = _peer_unsettled(link)
        source = link.remote_source
        principal, container = conn.principal, conn.container_id
        if source is None or principal is None or container is None:
            return None
        key = TerminusKey(principal.user_id, container, link.name)
        durable = source.durable
        policy = _expiry_policy(source)
        if durable not in (1, 2) or policy == LINK_DETACH:
            return Recovery(self.termini, key, group, 0, policy, 0, None, None, peer_unsettled)
        granted = CONNECTION_CLOSE if policy == NEVER else policy
        timeout = min(source.timeout, MAX_TIMEOUT)
        answer = replace(source, durable=durable, expiry_policy=granted, timeout=timeout)
        return Recovery(
            self.termini, key, group, durable, granted, timeout, answer, None, peer_unsettled
        )

    def _forget(self, recovery: Recovery | None) -> None:
        """A link that is not durable: the terminus kept under its name is dropped."""
        if recovery is not None:
            self.termini.discard(recovery.key)

    async def _recover(self, recovery: Recovery | None, partition_key: int) -> Recovery | None:
        """The recovery granted, with the terminus it resumes, taken from the store (one
        kept under its name for another address is dropped)."""
        if recovery is None or not recovery.durable:
            self._forget(recovery)
            return None
        kept = await self.termini.take(recovery.key, partition_key, recovery.group)
        return replace(recovery, kept=kept)

    async def _attach_durable(
        self,
        attaching: _Attaching,
        recovery: Recovery,
        events: EventLog,
        start: Position | None,
        head: int,
        event_hubs: bool,
        partition: int,
    ) -> None:
        """Serve a durable consumer link once the terminus it resumes (if any) is taken."""
        resumed = await self._recover(recovery, events.partition.key)
        if attaching.closed:  # the link went meanwhile: what it took is kept again
            _restore(resumed)
            return
        attaching.inner = ConsumerLink(
            attaching.conn,
            attaching.link,
            events,
            start,
            head=head,
            event_hubs=event_hubs,
            partition=partition,
            recovery=resumed,
        )
        attaching.conn.wake()

    def _grows(self, hub: str) -> _Grows:
        """How a partition-agnostic consumer of ``hub`` follows its partitions."""
        return _Grows(lambda: self.hubs.partitions(hub), self.hubs.listen)

    def _router(self, hub: str) -> Callable[[str | None, str | None], EventLog]:
        """Where a partition-agnostic producer's message goes: the partition its delivery
        annotation names, else its key's (:func:`key_partition`), else the next in turn."""

        def route(target: str | None, key: str | None) -> EventLog:
            logs = self.hubs.partitions(hub)
            if logs is None:
                raise BadMessage(NOT_FOUND, f"the stream {hub} was dropped")
            if target is not None:
                number = _partition_number(target, len(logs))
                if number is None:
                    raise BadMessage(NOT_FOUND, f"no such partition: {quote_input(target, 40)}")
                return logs[number]
            if key is not None:
                return logs[key_partition(key, len(logs))]
            return logs[next(self._spread) % len(logs)]

        return route

    def _parse_address(self, address: str | None) -> _Address:
        """``NAME``, ``NAME/$info``, ``NAME/Partitions/P``, ``NAME/ConsumerGroups/G`` and
        ``NAME/ConsumerGroups/G/Partitions/P`` (Event Hubs' forms; its default group
        ``$Default`` is no group), also as the path of a URI (``amqps://host:port/NAME``, as
        Event Hubs clients give it). Raises :class:`LinkRefused` for any other address."""
        parts = address_path(address or "").split("/")
        logs = self.hubs.partitions(parts[0])
        if logs is None or len(parts) > 5:
            raise LinkRefused(NOT_FOUND, f"no such node: {quote_input(address, 80)}")
        hub = parts[0]
        if parts[1:] == [INFO]:
            return _Address(hub, logs, info=True)
        group = None
        if len(parts) >= 3 and parts[1] == "ConsumerGroups" and parts[2]:
            group = None if parts[2] == DEFAULT_GROUP else parts[2]
            parts = [parts[0], *parts[3:]]
        if len(parts) == 1:
            return _Address(hub, logs, group)
        if len(parts) != 3 or parts[1] != "Partitions":
            raise LinkRefused(NOT_FOUND, f"no such node: {quote_input(address, 80)}")
        number = _partition_number(parts[2], len(logs))
        if number is None:
            raise LinkRefused(NOT_FOUND, _no_partition(parts[2], len(logs)))
        return _Address(hub, logs, group, number)

    def _attach_group(
        self,
        conn: Connection,
        link: Link,
        parsed: _Address,
        partition: int | None,
        group: Any,
        epoch: Any,
        event_hubs: bool,
        equal_takes_over: bool = False,
    ) -> LinkHandler:
        """One active link per group (of this user) and partition in the whole cluster; a
        higher epoch takes over (seed 4.5.2), also an equal one for an Event Hubs owner
        level. A link naming no partition is given a free one (4.5.1). The link is answered
        once its claim is back from the database (:class:`_Attaching`)."""
        if not isinstance(group, str) or not 0 < len(group) <= MAX_GROUP_CHARS:
            raise LinkRefused(
                INVALID_FIELD,
                f"event-streams-consumer-group must be a string of 1-{MAX_GROUP_CHARS} characters",
            )
        if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool)):
            raise LinkRefused(INVALID_FIELD, "event-streams-epoch must be a long")
        assert conn.principal is not None
        user_id = conn.principal.user_id
        binding = None
        if group.startswith(FTN18_GROUP_PREFIX):
            component = group[len(FTN18_GROUP_PREFIX) :]
            if not is_registrable(component):
                raise LinkRefused(
                    INVALID_FIELD,
                    f"not a consumer name (A-Z, a-z, 0-9, _; 1-16): {quote_input(group, 80)}",
                )
            binding = (user_id, component)
        # Refused before the claim, which may take the group from a live link.
        _start_position(link, parsed.logs[partition or 0].head)
        recovery = self._durability(conn, link, group)
        request = _GroupRequest(
            parsed.hub,
            parsed.logs,
            partition,
            group,
            None if epoch is None else int(epoch),
            equal_takes_over,
            event_hubs,
            binding,
            recovery,
        )
        return _Attaching(
            conn,
            link,
            lambda attaching: self._claim(attaching, request),
            "the consumer group could not be claimed",
        )

    async def _claim(self, attach: _Attaching, request: _GroupRequest) -> None:
        """Claim the group for ``attach``'s link, then answer the attach. A link naming no
        partition tries the partitions in turn (those without a link of the group here),
        taking only a free one."""
        conn, link = attach.conn, attach.link
        assert conn.principal is not None
        user_id = conn.principal.user_id
        group = request.group
        logs = request.logs
        if request.partition is not None:
            numbers = [request.partition]
        else:
            numbers = [
                n
                for n in range(len(logs))
                if (logs[n].partition.key, user_id, group) not in self._groups
            ]
        held_epoch = 0
        for number in numbers:
            events = logs[number]
            key = (events.partition.key, user_id, group)
            claimed, heard, recovery = await self._claim_one(events, key, request)
            held_epoch = claimed.epoch
            if claimed.taken:
                self._heard_claim(*key, claimed.claim, claimed.epoch)  # the older link here
            if attach.closed:  # the peer detached, or its connection went, meanwhile
                if claimed.taken and heard <= claimed.claim:
                    self._release_later(key, events, claimed.claim, None)
                _restore(recovery)
                return
            if claimed.taken:
                self._install(attach, request, number, key, claimed, heard, recovery)
                return
        if request.partition is None:
            conn.detach(
                link,
                DETACH_FORCED,
                f"every partition of {request.hub} has an active link of consumer group"
                f" {quote_input(group, 80)}",
            )
        else:
            conn.detach(
                link,
                RESOURCE_LOCKED,
                f"consumer group {quote_input(group, 80)} has an active link on partition"
                f" {request.partition} with epoch {held_epoch};"
                " attach with a higher event-streams-epoch to take over",
            )

    async def _claim_one(
        self, events: EventLog, key: _GroupKey, request: _GroupRequest
    ) -> tuple[GroupClaim, int, Recovery | None]:
        """The claim of the group on one partition, the newest claim heard of it while this
        one (and the take of the terminus the link resumes, once the group is taken) was on
        its way (a newer one has taken it from this one already), and the recovery."""
        if events.partition.key not in self._listening:
            self._listening[events.partition.key] = events.listen_group_claims(
                functools.partial(self._heard_claim, events.partition.key)
            )
        releasing = self._releasing.get(key)
        if releasing is not None:  # a link of the group here that just ended frees it first
            await asyncio.wait([releasing])
        self._claiming[key] = self._claiming.get(key, 0) + 1
        try:
            claimed = await events.claim_group(
                key[1],
                key[2],
                request.epoch,
                hold_seconds=GROUP_HOLD_SECONDS,
                equal_takes_over=request.equal_takes_over,
                free_only=request.partition is None,
            )
            recovery = await self._recover(request.recovery, key[0]) if claimed.taken else None
        finally:
            heard = self._heard.get(key, 0)
            self._claiming[key] -= 1
            if not self._claiming[key]:
                del self._claiming[key]
                self._heard.pop(key, None)
        return claimed, heard, recovery

    def _install(
        self,
        attach: _Attaching,
        request: _GroupRequest,
        number: int,
        key: _GroupKey,
        claimed: GroupClaim,
        heard: int,
        recovery: Recovery | None,
    ) -> None:
        """The group is the link's (the older link of the group here is detached already):
        serve it, unless a newer claim took the group while this one was on its way."""
        conn, link = attach.conn, attach.link
        if heard > claimed.claim or key in self._groups:
            _restore(recovery)
            conn.detach(link, LINK_STOLEN, "taken over by a newer link while attaching")
            return
        events = request.logs[number]
        group, binding = request.group, request.binding
        try:
            start = _start_position(link, events.head)
        except LinkRefused as exc:  # checked before the claim: not expected
            _restore(recovery)
            self._release_later(key, events, claimed.claim, None)
            conn.detach(link, exc.condition, str(exc))
            return

        def release(acking: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
            owner = self._groups.get(key)
            if owner is None or owner.link is not link:  # taken over: nothing to release
                return acking
            del self._groups[key]
            return self._release_later(key, events, claimed.claim, acking)

        self._groups[key] = _Owner(claimed.epoch, claimed.claim, conn, link, events)
        attach.inner = ConsumerLink(
            conn,
            link,
            events,
            start,
            recovery=recovery,
            properties={GROUP_PROPERTY: group, EPOCH_PROPERTY: claimed.epoch},
            binding=binding,
            fence=(group, claimed.claim),
            on_closed=release,
            event_hubs=request.event_hubs,
            partition=number,
        )
        conn.wake()
        if self._renewing is None or self._renewing.done():
            self._renewing = asyncio.ensure_future(self._renew())

    def _steal(self, key: _GroupKey, owner: _Owner, why: str) -> None:
        """Detach the group's link here: another claim holds the group now."""
        if self._groups.get(key) is owner:
            del self._groups[key]
        owner.conn.detach(owner.link, LINK_STOLEN, why)

    def _heard_claim(
        self, partition_key: int, user_id: UserId, group: str, claim: int, epoch: int
    ) -> None:
        """A group was taken (by another process, or by this one on PostgreSQL): its link
        here with an older claim is detached."""
        key = (partition_key, user_id, group)
        if key in self._claiming:
            self._heard[key] = max(self._heard.get(key, 0), claim)
        owner = self._groups.get(key)
        if owner is not None and owner.claim < claim:
            self._steal(key, owner, f"taken over with epoch {epoch}")

    def _release_later(
        self, key: _GroupKey, events: EventLog, claim: int, acking: asyncio.Future[None] | None
    ) -> asyncio.Future[None]:
        """Free the group once what its link accepted is stored; a link of the group that
        attaches here meanwhile waits for it."""

        async def release() -> None:
            if acking is not None:
                await asyncio.wait([acking])
            try:
                await events.release_group(key[1], key[2], claim)
            except Exception as exc:  # its hold runs out instead
                log.warning("releasing consumer group %s failed: %s", quote_input(key[2], 80), exc)
            finally:
                if self._releasing.get(key) is task:
                    del self._releasing[key]

        task = asyncio.ensure_future(release())
        self._releasing[key] = task
        return task

    async def _renew(self) -> None:
        """Renew the holds of the groups' links here while there are any; a link whose
        group another claim took (a takeover this process did not hear of) is detached."""
        while self._groups:
            await asyncio.sleep(GROUP_RENEW_SECONDS)
            by_partition: dict[int, tuple[EventLog, list[GroupHold]]] = {}
            for (partition_key, user_id, group), held in self._groups.items():
                holds = by_partition.setdefault(partition_key, (held.events, []))[1]
                holds.append((user_id, group, held.claim))
            for partition_key, (events, holds) in by_partition.items():
                try:
                    lost = await events.hold_groups(holds, GROUP_HOLD_SECONDS)
                except Exception as exc:  # the next round tries again
                    log.warning("renewing the holds of consumer groups failed: %s", exc)
                    continue
                for user_id, group, claim in lost:
                    key = (partition_key, user_id, group)
                    owner = self._groups.get(key)
                    if owner is not None and owner.claim == claim:
                        self._steal(key, owner, "taken over elsewhere")

    async def close(self) -> None:
        """Stop renewing, let the groups of the links that ended be released, and store the
        termini of the links suspended."""
        if self._renewing is not None:
            self._renewing.cancel()
        for stop in self._listening.values():
            stop()
        self._listening.clear()
        releasing = list(self._releasing.values())
        if releasing:
            await asyncio.wait(releasing, timeout=GROUP_RELEASE_SECONDS)
        await self.termini.close()


@dataclass(frozen=True, slots=True)
class _GroupRequest:
    """What a consumer group's attach asks for, checked."""

    hub: str
    logs: Sequence[EventLog]
    #: None: any partition free of the group's links.
    partition: int | None
    group: str
    epoch: int | None
    equal_takes_over: bool
    event_hubs: bool
    binding: tuple[UserId, str] | None
    #: The durability the link asks for (the terminus it resumes is taken with the group).
    recovery: Recovery | None


class _Attaching:
    """A consumer link while what its attach waits for is on its way to the database (the
    claim of its consumer group, the terminus it resumes). The attach is answered once
    ``attach(self)`` is done: a :class:`ConsumerLink` (:attr:`inner`) then serves the link,
    or the link is refused (``failed``: the sentence when it raised). Credit that comes
    meanwhile waits on the link."""

    def __init__(
        self,
        conn: Connection,
        link: Link,
        attach: Callable[[_Attaching], Coroutine[Any, Any, None]],
        failed: str,
    ) -> None:
        self.conn = conn
        self.link = link
        self.inner: ConsumerLink | None = None
        #: The link ended before it was answered.
        self.closed = False
        self._failed = failed
        self._task = asyncio.ensure_future(attach(self))
        self._task.add_done_callback(self._attached)

    def _attached(self, task: asyncio.Future[None]) -> None:
        exc = None if task.cancelled() else task.exception()
        if exc is not None and not self.closed:
            log.warning("%s: %s", self._failed, exc)
            self.conn.detach(self.link, INTERNAL_ERROR, self._failed)

    def on_flow(self) -> None:
        if self.inner is not None:
            self.inner.on_flow()

    def on_delivery(self, delivery: Delivery) -> None:
        pass  # the engine refuses transfers on a link the peer receives on

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        if self.inner is not None:
            self.inner.on_outcomes(deliveries)

    def on_writable(self) -> None:
        if self.inner is not None:
            self.inner.on_writable()

    def on_closed(self) -> asyncio.Future[None] | None:
        self.closed = True
        return self.inner.on_closed() if self.inner is not None else None


def _expiry_policy(source: Source) -> str:
    """The source's terminus expiry policy (AMQP's default when none); refused when it is
    none of AMQP's."""
    policy = source.expiry_policy if source.expiry_policy is not None else SESSION_END
    if policy not in (LINK_DETACH, SESSION_END, CONNECTION_CLOSE, NEVER):
        raise LinkRefused(INVALID_FIELD, f"not a terminus expiry policy: {quote_input(policy, 40)}")
    return policy


def _partition_number(text: str, count: int) -> int | None:
    """The partition a partition id names (``"0".."count-1"``, in canonical form)."""
    if not text.isdigit() or not text.isascii() or (text != "0" and text.startswith("0")):
        return None
    number = int(text)
    return number if number < count else None


def _no_partition(text: Any, count: int) -> str:
    return f"no such partition: {quote_input(text, 40)} (the partitions are '0'..'{count - 1}')"


def _requested_partition(properties: Mapping[Any, Any], parsed: _Address) -> int | None:
    """The partition the address or the ``event-streams-partition`` link property names
    (both: the same), or None."""
    requested = properties.get(PARTITION_PROPERTY)
    if requested is None:
        return parsed.partition
    if not isinstance(requested, str):
        raise LinkRefused(INVALID_FIELD, "event-streams-partition must be a symbol")
    number = _partition_number(requested, len(parsed.logs))
    if number is None:
        raise LinkRefused(NOT_FOUND, _no_partition(requested, len(parsed.logs)))
    if parsed.partition is not None and number != parsed.partition:
        raise LinkRefused(
            INVALID_FIELD,
            f"event-streams-partition {requested} is not the partition of the address"
            f" ({parsed.partition})",
        )
    return number


@dataclass(frozen=True, slots=True)
class Recovery:
    """A consumer link's durability as granted, and the terminus it resumes, if any."""

    termini: Termini
    key: TerminusKey
    #: The consumer group of the link's address (a terminus resumes only the same).
    group: str | None
    #: 1: configuration (the position alone), 2: unsettled state too; 0: none.
    durable: int
    #: session-end or connection-close.
    expiry: str
    timeout: int
    #: Our terminus, as granted (None: not durable).
    source: Source | None
    kept: KeptTerminus | None
    #: The peer's unsettled map (tag -> its state).
    peer_unsettled: Mapping[bytes, Any]


def _restore(recovery: Recovery | None) -> None:
    """Keep again the terminus a link took and will not resume (it went first)."""
    if recovery is not None and recovery.kept is not None:
        recovery.termini.restore(recovery.kept)


def _joined(*futures: asyncio.Future[None] | None) -> asyncio.Future[None] | None:
    """Done once each of ``futures`` is (None: none is due)."""
    due = [future for future in futures if future is not None]
    if len(due) <= 1:
        return due[0] if due else None

    async def all_done() -> None:
        await asyncio.wait(due)

    return asyncio.ensure_future(all_done())


def _peer_unsettled(link: Link) -> Mapping[bytes, Any]:
    """The peer's unsettled map of the attach, checked (AMQP 2.6.13)."""
    unsettled = link.remote.unsettled
    if unsettled is None:
        return {}
    if not isinstance(unsettled, Mapping):
        raise LinkRefused(INVALID_FIELD, "the unsettled map must be a map")
    if len(unsettled) > MAX_PEER_UNSETTLED:
        raise LinkRefused(
            INVALID_FIELD,
            f"an unsettled map of {len(unsettled)} deliveries (at most {MAX_PEER_UNSETTLED})",
        )
    states: dict[bytes, Any] = {}
    for tag, value in unsettled.items():
        if not isinstance(tag, bytes):
            raise LinkRefused(INVALID_FIELD, "the unsettled map's keys must be delivery tags")
        try:
            state = from_described(value) if isinstance(value, Described) else value
        except DecodeError:
            state = value
        if state is not None and not isinstance(state, _STATES):
            raise LinkRefused(
                INVALID_FIELD, "the unsettled map's values must be delivery states or null"
            )
        states[tag] = state
    return states


def _link_properties(link: Link) -> Mapping[Any, Any]:
    properties = link.remote_properties
    if properties is None:
        return {}
    if not isinstance(properties, Mapping):
        raise LinkRefused(INVALID_FIELD, "link properties must be a map")
    return properties


def _start_position(link: Link, head: int) -> Position | None:
    """The consumer's start from its source filters; None without a filter."""
    filters = _filter_set(link)
    if not filters:
        return None
    if not isinstance(filters, Mapping):
        raise LinkRefused(INVALID_FIELD, "the source filter must be a map")
    position: Position | None = None
    try:
        for value in filters.values():
            descriptor, argument = described_filter(value)
            kind = filter_kind(descriptor)
            if kind == DELIVERY_ANNOTATIONS_FILTER:
                this = delivery_annotations_start(argument, head=head)
            elif kind in (SQL_FILTER, SELECTOR_FILTER):
                if not isinstance(argument, str):
                    raise BadFilter("an SQL or selector filter is a string")
                this = compile_filter(argument, head=head)
            else:
                raise BadFilter(f"filter not supported: {quote_input(descriptor, 60)}")
            position = this if position is None else position.both(this)
    except BadFilter as exc:
        raise LinkRefused(INVALID_FIELD, str(exc)) from None
    return position


def _filter_set(link: Link) -> Any:
    source = link.remote_source
    return source.filter if source is not None else None


_SECTION: Final = b"\x00\x53"
#: Header, delivery annotations, message annotations: the sections before the rest.
_LEADING_SECTIONS: Final = (0x70, 0x71, 0x72)


_HEADER: Final = b"\x00\x53\x70"
_DELIVERY_ANNOTATIONS: Final = b"\x00\x53\x71"
_MESSAGE_ANNOTATIONS: Final = b"\x00\x53\x72"


def _header_size(raw: bytes) -> int:
    """The size of the message's header section (some clients write one into every message), read
    without decoding it; 0 when there is none (or it is of a form left to the decoder)."""
    if raw[:3] != _HEADER or len(raw) < 5:
        return 0
    constructor = raw[3]
    if constructor == 0x45:  # list0
        return 4
    if constructor == 0xC0:  # list8: size, then count and items
        return 5 + raw[4]
    if constructor == 0xD0 and len(raw) >= 8:  # list32
        return 8 + int.from_bytes(raw[4:8], "big")
    return 0


def _routing(raw: bytes) -> tuple[str | None, str | None]:
    """The ``event-streams-target-partition`` delivery annotation and the partition key
    (message annotation) of an encoded message, when it has them."""
    start = _header_size(raw)
    if raw[start : start + 3] not in (_DELIVERY_ANNOTATIONS, _MESSAGE_ANNOTATIONS):
        return None, None  # the common case: nothing to decode
    target = key = None
    view = memoryview(raw)[start:]
    while len(view) > 2 and view[:2].tobytes() == _SECTION and view[2] in _LEADING_SECTIONS:
        try:
            value, used = decode_value(view, 0)
        except DecodeError as exc:
            raise BadMessage(DECODE_ERROR, f"undecodable message: {exc}") from None
        view = view[used:]
        if not isinstance(value, Described) or not isinstance(value.value, Mapping):
            continue
        if value.descriptor == 0x71:
            target = value.value.get(TARGET_PARTITION, target)
        elif value.descriptor == 0x72:
            for name in PARTITION_KEYS:
                key = value.value.get(name, key)
    if target is not None and not isinstance(target, str):
        raise BadMessage(INVALID_FIELD, "event-streams-target-partition must be a symbol")
    if key is not None and not isinstance(key, str):
        raise BadMessage(INVALID_FIELD, "a partition key must be a string")
    return target, key


def _message_key(message: Message) -> str | None:
    """The partition key of a batched message (when its batch has none of its own)."""
    annotations: Mapping[Any, Any] = message.annotations or {}
    for name in PARTITION_KEYS:
        key = annotations.get(name)
        if key is not None:
            if not isinstance(key, str):
                raise BadMessage(INVALID_FIELD, "a partition key must be a string")
            return key
    return None


class ProducerLink:
    """Messages to the node become events; each is settled ``accepted`` once it is durable.

    A partition-bound link stores in its partition; a partition-agnostic one where its
    router sends each message (a batch whole to one partition). Credit is kept at the window
    less the messages still on their way to the store, so a producer only waits for credit
    when the store falls behind.
    """

    def __init__(
        self,
        conn: Connection,
        link: Link,
        events: EventLog,
        limits: NodeLimits,
        calls: Calls | None = None,
        *,
        router: Callable[[str | None, str | None], EventLog] | None = None,
        partition: int | None = 0,
    ):
        who = conn.principal
        assert who is not None, "the node table takes no such link without a user"
        self._conn = conn
        #: The user the link was attached as: it appends as them.
        self._who = who
        self._calls = calls if calls is not None else Calls("amqp")
        self._link = link
        self._events = events
        self._router = router
        self._partition = partition
        self._limits = limits
        self._in_store = 0
        self._closed = False
        link.accept(properties=link_answer(partition), max_message_size=limits.max_message_bytes)
        self._top_up()

    def on_flow(self) -> None:
        pass

    def on_writable(self) -> None:
        pass

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        pass

    def on_closed(self) -> asyncio.Future[None] | None:
        self._closed = True
        return None

    def on_delivery(self, delivery: Delivery) -> None:
        """A whole message (the engine detaches a link whose message is too large)."""
        started = time.perf_counter()
        try:
            future = self._append(delivery.payload, delivery.message_format == BATCH_FORMAT)
        except BadMessage as exc:
            delivery.reject(exc.condition, str(exc))
            self._count(exc.condition, started)
        except Refused as exc:  # the right went before the link was detached for it
            delivery.reject(UNAUTHORIZED, str(exc))
            self._count(UNAUTHORIZED, started)
        except RuntimeError as exc:  # the store is closing, or the stream was dropped
            delivery.reject(INTERNAL_ERROR, str(exc))
            self._count(INTERNAL_ERROR, started)
        except ValueError as exc:  # an aggregated stream: only its copying adds events
            delivery.reject(NOT_ALLOWED, str(exc))
            self._count(NOT_ALLOWED, started)
        else:
            self._in_store += 1
            future.add_done_callback(lambda done: self._stored(delivery, done, started))
        self._top_up()

    def _append(self, raw: bytes, batch: bool) -> asyncio.Future[Any]:
        """Every event of the message (of each message of a batch) queued for the store, or
        none when one of them cannot be an event."""
        target, key = _routing(raw)
        quick = None if batch else quick_event(raw)
        if quick is not None:
            events = [quick]
        elif batch:
            messages = batch_messages(raw)
            if key is None and target is None and self._router is not None:
                key = _message_key(messages[0])
            events = [message_to_event(message) for message in messages]
        else:
            try:
                message = decode_message(raw)
            except DecodeError as exc:
                raise BadMessage(DECODE_ERROR, f"undecodable message: {exc}") from None
            events = [message_to_event(message)]
        try:
            encoded = [stored_form(event) for event in events]
            keys = [None if e.key is None else check_event_key(e.key) for e in events]
            destination = self._destination(target, key)
            if all(k is None for k in keys):
                return destination.append_encoded(self._who, encoded)
            return destination.append_encoded(self._who, encoded, keys)
        except EventRejected as exc:  # not an event, a bad key, or its type's schema refuses it
            raise BadMessage(INVALID_FIELD, str(exc)) from None

    def _destination(self, target: str | None, key: str | None) -> EventLog:
        if self._router is not None:
            return self._router(target, key)
        if target is not None and target != str(self._partition):
            raise BadMessage(
                PRECONDITION_FAILED,
                f"event-streams-target-partition {quote_input(target, 40)} on a link bound to"
                f" partition {self._partition}",
            )
        return self._events

    def _count(self, outcome: str, started: float) -> None:
        self._calls.observe(NODE, "send", outcome, time.perf_counter() - started)

    def _stored(self, delivery: Delivery, done: asyncio.Future[Any], started: float) -> None:
        self._in_store -= 1
        if self._closed:
            if not done.cancelled():
                done.exception()  # retrieved: nobody is left to tell
            return
        if done.cancelled() or done.exception() is not None:
            delivery.reject(INTERNAL_ERROR, "the event could not be stored")
            self._count(INTERNAL_ERROR, started)
        else:
            delivery.accept()
            self._count("ok", started)
        self._top_up()
        self._conn.wake()

    def _top_up(self) -> None:
        if self._closed:
            return
        window = self._limits.credit_window
        room = window - self._link.credit - self._in_store
        if room >= window // 2 or (room > 0 and self._link.credit == 0):
            self._link.flow(room)


class ConsumerLink(SourceLink):
    """Events after the start position, one per unit of credit, in id order.

    Bound to a registered consumer, the link starts at its stored position when it has no
    filter, and moves that position as the consumer settles what it was sent: up to just
    before the oldest delivery not yet accepted (or rejected), in one write at a time. With
    ``fence`` (its consumer group and claim), a write after another link took the group
    moves nothing, and the link is detached as stolen.

    With ``recovery`` (a durable source), a suspended link leaves its terminus to the node's
    :class:`~.resume.Termini`, and a link that resumes one settles, sends again and goes on
    as AMQP 2.6.13 says (:meth:`_resume`).
    """

    def __init__(
        self,
        conn: Connection,
        link: Link,
        events: EventLog,
        start: Position | None,
        *,
        properties: Mapping[Any, Any] | None = None,
        binding: tuple[UserId, str] | None = None,
        fence: tuple[str, int] | None = None,
        on_closed: Callable[[asyncio.Future[None] | None], asyncio.Future[None] | None]
        | None = None,
        event_hubs: bool = False,
        partition: int = 0,
        recovery: Recovery | None = None,
        head: int | None = None,
    ) -> None:
        """``on_closed`` is given the write of the position still on its way (if any) and
        returns what the detach's answer waits for; ``head``: the log's head at the attach
        (now when None)."""
        #: Opened through an Event Hubs address: JSON goes out as a ``data`` section.
        self._event_hubs = event_hubs
        #: No filter: events added from the attach on (seed 3.2), or the bound consumer's
        #: position.
        self._start = (
            start if start is not None else Position(events.head if head is None else head)
        )
        self._filtered = start is not None
        self._binding = binding
        self._fence = fence
        self._released = on_closed
        self._after = 0
        self._unsettled: deque[int] = deque()
        self._done: set[int] = set()
        self._ack_wanted = 0
        self._acked = 0
        self._acking: asyncio.Task[None] | None = None
        self._recovery = recovery
        self._partition = partition
        #: Ids sent and not settled, kept when the link is suspended (a durable source).
        self._open: set[int] | None = set() if recovery is not None else None
        self._stop_listening = events.listen(self._on_head)
        kept = recovery.kept if recovery is not None else None
        ours = None
        if kept is not None and recovery is not None and recovery.durable == 2:
            ours = dict.fromkeys((b"%d" % i for i in kept.unsettled), None)
        super().__init__(
            conn,
            link,
            events,
            properties,
            partition,
            source=recovery.source if recovery is not None else None,
            unsettled=ours,
            incomplete_unsettled=ours is not None and kept is not None and kept.incomplete,
        )

    def _on_head(self) -> None:
        self._wake.set()

    def on_closed(self) -> asyncio.Future[None] | None:
        """The detach is answered once the accepted part of what was sent is stored (and
        the consumer group released), and the terminus of a suspended link."""
        self._stop_listening()
        keeping = None
        if self._recovery is not None and self._link.suspended and not self._closed:
            keeping = self._keep(self._recovery)
        super().on_closed()
        if self._released is not None:
            return _joined(self._released(self._acking), keeping)
        return _joined(self._acking, keeping)

    def _keep(self, recovery: Recovery) -> asyncio.Future[None]:
        """Leave the terminus to the node: the oldest ids, within the bound; the future of
        its write."""
        assert self._open is not None
        held = [i for i in self._unsettled if i not in self._done]
        unsettled = sorted(self._open)
        after = self._after
        ids = sorted({*held, *unsettled})
        incomplete = len(ids) > MAX_UNSETTLED
        if incomplete:  # beyond the bound: what follows the newest kept id is sent again
            after = ids[MAX_UNSETTLED - 1]
            held = [i for i in held if i <= after]
            unsettled = [i for i in unsettled if i <= after]
        if recovery.durable == 1:  # the position alone: from the oldest unsettled on
            after = min(after, unsettled[0] - 1) if unsettled else after
            unsettled = []
        terminus = KeptTerminus(
            recovery.key,
            self._events.partition.key,
            recovery.group,
            recovery.durable,
            tuple(unsettled),
            incomplete,
            after,
            tuple(held),
            self._acked,
            float(recovery.timeout),
        )
        termini = recovery.termini
        kept, written = termini.keep(terminus)
        session = recovery.expiry == SESSION_END
        kept.cancel_wait = self._conn.when_ended(
            self._link, session, lambda: termini.expire_later(kept)
        )
        return written

    async def _start_after(self) -> int:
        after = self._start.after_id
        if self._binding is not None:
            _user_id, component = self._binding
            consumers = self._events.consumers
            await consumers.register(self._who, component, transport="amqp")
            position = await consumers.position(self._who, component)
            if not self._filtered and position is not None:
                after = position
        return await self._after_time(self._events, self._start, after)

    def _resume(self, kept: KeptTerminus) -> list[tuple[int, Any]]:
        """Take over the kept terminus: where to go on, what holds a group's position, and
        what to send first, as (event id, the peer's state): by the peer's unsettled map, a
        terminal accepted or rejected is settled (a resumed transfer with no payload), a
        released or modified one is settled and sent again, one with no state is resumed
        whole, one the peer does not know is sent again as a new delivery."""
        recovery = self._recovery
        assert recovery is not None
        self._after = kept.after
        self._acked = kept.acked
        if recovery.durable != 2 or kept.durable != 2:
            if kept.unsettled:  # kept with its deliveries, resumed with the position alone
                self._after = min(self._after, kept.unsettled[0] - 1)
            # what is read again from the position is held back by its new deliveries
            self._unsettled.extend(i for i in kept.held if i <= self._after)
            return []
        self._unsettled.extend(kept.held)
        peer = recovery.peer_unsettled
        if self._open is not None:  # unsettled until settled again (or suspended again)
            self._open.update(kept.unsettled)
        return [(event_id, peer.get(b"%d" % event_id, _ABSENT)) for event_id in kept.unsettled]

    async def _send_first(self, first: list[tuple[int, Any]]) -> None:
        """Send what the resumed terminus owes, as credit allows (each item a transfer)."""
        link = self._link
        encode = _ENCODER.encode
        items: deque[tuple[int, Any]] = deque()
        for event_id, state in first:
            items.append((event_id, state))
            if isinstance(state, Released | Modified):
                items.append((event_id, _ABSENT))  # settled, then sent again
        while items:
            self._wake.clear()
            if link.credit <= 0 or not self._conn.writable:
                await self._wake.wait()
                continue
            chunk = list(itertools.islice(items, min(link.credit, READ_BATCH)))
            found = await self._read_ids({event_id for event_id, _state in chunk})
            for event_id, state in chunk:
                if link.credit <= 0:
                    break
                items.popleft()
                tag = b"%d" % event_id
                event = found.get(event_id)
                opened = self._open
                assert opened is not None
                if isinstance(state, Accepted | Rejected | Released | Modified):
                    link.send(b"", tag, settled=True, resume=True, state=state)
                    if isinstance(state, Accepted | Rejected):
                        self._done.add(event_id)
                        opened.discard(event_id)
                elif event is None:  # gone from the log (retention): nothing to send again
                    if state is not _ABSENT:
                        link.send(b"", tag, settled=True, resume=True)
                    self._done.add(event_id)
                    opened.discard(event_id)
                else:
                    message = encode(event, self._event_hubs)
                    delivery = link.send(message, tag, resume=state is not _ABSENT)
                    if delivery.settled:
                        opened.discard(event_id)
            self._acknowledge()
            self._conn.wake()

    async def _read_ids(self, ids: set[int]) -> dict[int, StoredEvent]:
        """The events of these ids that the log still has."""
        found: dict[int, StoredEvent] = {}
        after, top = min(ids) - 1, max(ids)
        while after < top:
            page = await self._events.read_after(self._who, after, READ_BATCH)
            if not page:
                break
            found.update((event.id, event) for event in page if event.id in ids)
            after = page[-1].id
        return found

    async def _run(self) -> None:
        self._after = self._acked = await self._start_after()
        kept = self._recovery.kept if self._recovery is not None else None
        if kept is not None:
            await self._send_first(self._resume(kept))
        link = self._link
        matches = self._start.matches
        encode = _ENCODER.encode
        event_hubs = self._event_hubs
        bound = self._binding is not None
        # Read a page at a time whatever the credit (clients that top their credit up by a
        # few at a time would make as many reads), and send it as the credit comes; while
        # it is sent, the next page is read (one ahead at most, when the log has more).
        page: list[StoredEvent] = []
        index = 0
        read_up_to = self._after
        ahead: asyncio.Future[list[StoredEvent]] | None = None
        try:
            while True:
                self._wake.clear()
                if link.credit > 0 and self._conn.writable:
                    if index == len(page) and self._events.head > read_up_to:
                        if ahead is None:
                            ahead = self._read_page(read_up_to)
                        page, ahead = await ahead, None
                        index = 0
                        if page:
                            read_up_to = page[-1].id
                            if self._events.head > read_up_to:
                                ahead = self._read_page(read_up_to)
                    sent = self._send_page(page, index, matches, encode, event_hubs, bound)
                    if sent != index:
                        index = sent
                        continue
                caught_up = index == len(page) and self._events.head <= read_up_to
                if link.credit > 0 and link.drain and caught_up:
                    if await _newer_committed([self._events], [read_up_to]):
                        continue
                    link.drained()
                    self._conn.wake()
                await self._wake.wait()
        finally:
            if ahead is not None:
                ahead.cancel()

    def _read_page(self, after: int) -> asyncio.Future[list[StoredEvent]]:
        """The page after ``after``, being read (a task of its own: it may be read ahead)."""
        page = asyncio.ensure_future(self._events.read_after(self._who, after, READ_BATCH))
        page.add_done_callback(retrieve_quietly)
        return page

    def _send_page(
        self,
        page: list[StoredEvent],
        index: int,
        matches: Callable[[StoredEvent], bool] | None,
        encode: Callable[[StoredEvent, bool], bytes],
        event_hubs: bool,
        bound: bool,
    ) -> int:
        """Send what the credit allows of ``page`` from ``index`` on; the index to go on
        from (``index``: nothing sent)."""
        link = self._link
        opened = self._open
        if index == len(page) or link.credit <= 0:
            return index
        if matches is None:  # one event per unit of credit
            end = min(len(page), index + link.credit)
            sending = page[index:end]
        else:  # the events the filter lets through take credit
            end = index
            sending = []
            while end < len(page) and len(sending) < link.credit:
                if matches(page[end]):
                    sending.append(page[end])
                end += 1
        messages = [(encode(event, event_hubs), b"%d" % event.id) for event in sending]
        if not link.send_many(messages):
            if bound:
                self._unsettled.extend(event.id for event in sending)
            if opened is not None:
                opened.update(event.id for event in sending)
        self._after = page[end - 1].id
        self._acknowledge()
        self._conn.wake()
        return end

    def on_outcomes(self, deliveries: list[Delivery]) -> None:
        opened = self._open
        if opened is not None:
            opened.difference_update(int(d.tag) for d in deliveries if d.settled)
        if self._binding is None:
            return
        done = [int(d.tag) for d in deliveries if isinstance(d.remote_state, Accepted | Rejected)]
        if done:
            self._done.update(done)
            self._acknowledge()

    def _acknowledge(self) -> None:
        """Move the bound consumer's position over what is settled or was skipped."""
        if self._binding is None:
            return
        unsettled = self._unsettled
        while unsettled and unsettled[0] in self._done:
            self._done.discard(unsettled.popleft())
        self._ack_wanted = unsettled[0] - 1 if unsettled else self._after
        if self._acking is None or self._acking.done():
            self._acking = asyncio.ensure_future(self._write_position())

    async def _write_position(self) -> None:
        # Not cancelled with the link: what the consumer accepted is stored even if it leaves.
        assert self._binding is not None
        user_id, component = self._binding
        fence = self._fence
        consumers = self._events.consumers
        while self._ack_wanted > self._acked:
            wanted = self._ack_wanted
            try:
                if fence is None:
                    await consumers.acknowledge(self._who, component, wanted)
                elif (
                    await self._events.acknowledge_group(user_id, *fence, component, wanted) is None
                ):
                    self._fenced()
                    return
            except PositionPastHead as exc:  # only ids sent move it: no client gets here
                log.error("the position of %s was not stored: %s", component, exc)
                if not self._closed:
                    self._conn.detach(self._link, PRECONDITION_FAILED, str(exc))
                return
            except Exception:
                log.exception("storing the position of %s failed", component)
                return
            self._acked = wanted

    def _fenced(self) -> None:
        """Another link took the group (or the consumer was dropped): the position is not
        this link's to move any more."""
        assert self._fence is not None
        log.info(
            "consumer group %s taken over: its position stays", quote_input(self._fence[0], 80)
        )
        if not self._closed:
            self._conn.detach(
                self._link,
                LINK_STOLEN,
                "the consumer group was taken over (or its consumer dropped): this link's"
                " settlements no longer move its position",
            )


def _source_annotation(partition: int) -> tuple[bytes, int]:
    """The encoded ``event-streams-source-partition`` entry of a delivery-annotations map:
    its bytes and how many map items it is (2)."""
    encoded = encode({SOURCE_PARTITION: Symbol(str(partition))})
    if encoded[0] == 0xC1:  # map8: constructor, size, count
        return encoded[3:], 2
    return encoded[9:], 2  # map32


def _annotated(message: bytes, entry: tuple[bytes, int]) -> bytes:
    """``message`` (delivery annotations first, as :class:`EventEncoder` writes it) with one
    more entry in its delivery annotations."""
    extra, items = entry
    if message[3] == 0xC1:
        size, count = message[4], message[5]
        if size + len(extra) <= 0xFF and count + items <= 0xFF:
            head = bytes((0xC1, size + len(extra), count + items))
            return message[:3] + head + message[6 : 5 + size] + extra + message[5 + size :]
        body = message[6 : 5 + size]
        rest = message[5 + size :]
        count_total = count + items
    else:
        size = int.from_bytes(message[4:8], "big")
        count = int.from_bytes(message[8:12], "big")
        body = message[12 : 8 + size]
        rest = message[8 + size :]
        count_total = count + items
    content = body + extra
    head = b"\xd1" + (len(content) + 4).to_bytes(4, "big") + count_total.to_bytes(4, "big")
    return message[:3] + head + content + rest


async def _newer_committed(logs: Sequence[EventLog], afters: Sequence[int]) -> bool:
    """Before a drain is answered with nothing more: whether the database has events after
    ``afters`` that this process has not heard of yet (another worker or process committed
    them, and may have acknowledged them already); the heads learn of them."""
    for events in logs:
        await events.catch_up()
    return any(events.head > after for events, after in zip(logs, afters, strict=True))


@dataclass(frozen=True, slots=True)
class _Grows:
    """A stream's partitions now (None once it is dropped), and how to hear of a change."""

    current: Callable[[], Sequence[EventLog] | None]
    listen: Callable[[Callable[[], None]], Callable[[], None]]


class PartitionsLink(SourceLink):
    """A partition-agnostic consumer: the events of every partition of the stream, each
    partition in id order, every transfer annotated with its partition
    (``event-streams-source-partition``). Partitions take turns for the credit. A partition
    the stream gains later (``futoin-evt stream grow``) is read from its first event, under
    the link's filter but for an offset (which names a place in another partition)."""

    def __init__(
        self,
        conn: Connection,
        link: Link,
        logs: Sequence[EventLog],
        starts: Sequence[Position | None],
        *,
        event_hubs: bool = False,
        grows: _Grows | None = None,
    ) -> None:
        self._logs = list(logs)
        #: What a partition added later starts from: its first event, after the filter's time.
        first = next((start for start in starts if start is not None), None)
        self._later = Position(0, first.after_ms, first.matches) if first else Position(0)
        self._starts = [
            start if start is not None else Position(events.head)
            for events, start in zip(logs, starts, strict=True)
        ]
        self._event_hubs = event_hubs
        self._entries = [_source_annotation(number) for number in range(len(logs))]
        self._stops = [events.listen(self._on_head) for events in logs]
        self._grows = grows
        if grows is not None:
            self._stops.append(grows.listen(self._on_head))
        super().__init__(conn, link, logs[0])

    async def _grown(self, afters: list[int]) -> None:
        """Take the partitions the stream gained since the last look."""
        logs = self._grows.current() if self._grows is not None else None
        if logs is None or len(logs) <= len(self._logs):
            return
        for number in range(len(self._logs), len(logs)):
            events = logs[number]
            self._logs.append(events)
            self._starts.append(self._later)
            self._entries.append(_source_annotation(number))
            self._stops.append(events.listen(self._on_head))
            afters.append(await self._after_time(events, self._later, 0))

    def _on_head(self) -> None:
        self._wake.set()

    def on_closed(self) -> asyncio.Future[None] | None:
        for stop in self._stops:
            stop()
        return super().on_closed()

    async def _run(self) -> None:
        logs = self._logs
        afters = [
            await self._after_time(events, start, start.after_id)
            for events, start in zip(logs, self._starts, strict=True)
        ]
        link = self._link
        encode = _ENCODER.encode
        event_hubs = self._event_hubs
        turn = 0
        while True:
            self._wake.clear()
            await self._grown(afters)
            sent = read = False
            for step in range(len(logs)):
                number = (turn + step) % len(logs)
                events = logs[number]
                if link.credit <= 0 or not self._conn.writable:
                    break
                if events.head <= afters[number]:
                    continue
                share = max(1, min(link.credit, READ_BATCH) // len(logs))
                matches = self._starts[number].matches
                entry = self._entries[number]
                for event in await events.read_after(self._who, afters[number], share):
                    if link.credit <= 0:
                        break
                    read = True
                    afters[number] = event.id
                    if matches is None or matches(event):
                        message = _annotated(encode(event, event_hubs), entry)
                        self._send(message, f"{number}:{event.id}")
                        sent = True
            turn += 1
            if sent:
                self._conn.wake()
            if read:
                continue
            caught_up = all(e.head <= after for e, after in zip(logs, afters, strict=True))
            if link.credit > 0 and link.drain and caught_up:
                if await _newer_committed(logs, afters):
                    continue
                link.drained()
                self._conn.wake()
            await self._wake.wait()


class InfoLink(SourceLink):
    """``NAME/$info``: one message with the bounds of every partition per unit of credit."""

    def __init__(self, conn: Connection, link: Link, logs: Sequence[EventLog]) -> None:
        self._logs = list(logs)
        super().__init__(conn, link, logs[0])

    async def _run(self) -> None:
        link = self._link
        sent = 0
        while True:
            self._wake.clear()
            while link.credit > 0:
                bounds = [await events.bounds(self._who) for events in self._logs]
                sent += 1
                info = Message(body=_info([(b.first_id, b.last_id) for b in bounds]))
                self._send(info.encode(), str(sent))
                self._conn.wake()
            await self._wake.wait()


def _info(bounds: Sequence[tuple[int | None, int | None]]) -> dict[Any, Any]:
    def offset(event_id: int | None) -> Any:
        return Symbol(format_offset(event_id)) if event_id is not None else None

    return {
        Symbol("partitions"): [
            {
                Symbol("partition"): Symbol(str(number)),
                Symbol("earliest-offset"): offset(first_id),
                Symbol("latest-offset"): offset(last_id),
            }
            for number, (first_id, last_id) in enumerate(bounds)
        ],
        Symbol("futoin-evt:head-id"): max((last or 0) for _first, last in bounds),
    }
