"""The event log node ``events`` (one partition, ``"0"``) and its ``$info`` source.

A link is taken by :meth:`EventLogNode.attach`, which checks the address, the caller and the
link properties and returns the handler that then serves it: :class:`ProducerLink` for
messages sent to the node, :class:`ConsumerLink` for events read from it, :class:`InfoLink`
for the runtime information. Handlers call the event log, never the store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Protocol

from proton import Condition, Delivery, Link, Message, MessageException, symbol

from ..auth.sas import SasVerifier
from ..domain.stream import EventRejected, UserId
from ..log.eventlog import EventLog, is_registrable
from ..notify.live import LiveEvents
from ..notify.management import CONSUMER_REGISTERED, ManagementBus
from ..quoting import quote_input
from ..stats import Calls
from .cbs import CBS, CbsNode
from .codec import (
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
from .connection import UNAUTHORIZED, LinkHandler, LinkRefused
from .filters import compile_filter
from .management import MANAGEMENT, ManagementNode
from .quickdecode import quick_event

if TYPE_CHECKING:
    from .connection import AmqpConnection

log = logging.getLogger(__name__)

NODE: Final = "events"
INFO: Final = "events/$info"
PARTITION: Final = "0"
PARTITION_PROPERTY: Final = symbol("event-streams-partition")
GROUP_PROPERTY: Final = symbol("event-streams-consumer-group")
EPOCH_PROPERTY: Final = symbol("event-streams-epoch")
#: A consumer group named ``ftn18:<component>`` keeps its position as the user's registered
#: FTN18 consumer ``<component>`` (registered on attach if need be).
FTN18_GROUP_PREFIX: Final = "ftn18:"
MAX_GROUP_CHARS: Final = 256
#: Event Hubs' default consumer group: in an address, the same as no group.
DEFAULT_GROUP: Final = "$Default"
#: Events read from the store for a consumer at once (less when its credit is lower).
READ_BATCH: Final = 1000

_ENCODER: Final = EventEncoder()

NOT_FOUND: Final = "amqp:not-found"
INVALID_FIELD: Final = "amqp:invalid-field"
DECODE_ERROR: Final = "amqp:decode-error"
INTERNAL_ERROR: Final = "amqp:internal-error"
MESSAGE_SIZE_EXCEEDED: Final = "amqp:link:message-size-exceeded"
LINK_STOLEN: Final = "amqp:link:stolen"
RESOURCE_LOCKED: Final = "amqp:resource-locked"


class AddressNode(Protocol):
    """A node at an address of its own, beside the event log (``$events``)."""

    @property
    def address(self) -> str: ...
    @property
    def live(self) -> LiveEvents: ...
    @property
    def bus(self) -> ManagementBus | None: ...

    def takes(self, address: str) -> bool:
        """True when ``address`` is this node's (or below it)."""

    async def event_types(self, stream: str | None, event_type: str | None) -> dict[str, list[str]]:
        """GET-EVENTS of a stream (None: ``events``); UnknownStream."""

    def attach(self, conn: AmqpConnection, link: Link) -> LinkHandler:
        """The handler for a new link, or :class:`LinkRefused`."""


@dataclass(slots=True)
class _Owner:
    """The active receive link of a consumer group, and its epoch."""

    epoch: int
    conn: AmqpConnection
    link: Link


class EventLogNode:
    """Routes attaches to the handlers of the one event log."""

    def __init__(
        self,
        events: EventLog,
        limits: NodeLimits = DEFAULT_NODE_LIMITS,
        sas: SasVerifier | None = None,
        notifications: AddressNode | None = None,
    ) -> None:
        self.events = events
        self.limits = limits
        #: Messages sent to the node, by outcome, with the time to their settlement (metrics).
        self.calls = Calls("amqp")
        self._groups: dict[tuple[UserId, str], _Owner] = {}
        #: ``$events`` (event notification), when served.
        self._notifications = notifications
        event_types = notifications.event_types if notifications is not None else None
        self._management = ManagementNode(events, NODE, PARTITION, event_types)
        self._cbs = CbsNode(sas)

    def attach(self, conn: AmqpConnection, link: Link) -> LinkHandler:
        """The handler for a new link, or :class:`LinkRefused`."""
        terminus = link.remote_target if link.is_receiver else link.remote_source
        address = terminus.address if terminus is not None else None
        uri = address is not None and "://" in address
        address = _address_path(address) if address is not None else None
        if address == CBS:
            return self._cbs.attach(conn, link)
        if conn.principal is None:
            raise LinkRefused(
                UNAUTHORIZED,
                "log in with SASL PLAIN as a user of this server, or put a SAS token to $cbs",
            )
        if address == MANAGEMENT:
            return self._management.attach(conn, link)
        notifications = self._notifications
        if notifications is not None and address is not None and notifications.takes(address):
            return notifications.attach(conn, link)
        if address == INFO:
            if link.is_receiver:
                raise LinkRefused(NOT_FOUND, "$info is a source: attach a receiving link")
            _check_partition(_link_properties(link))
            return InfoLink(conn, link, self.events)
        address_group, names_partition = _parse_address(address)
        properties = _link_properties(link)
        _check_partition(properties)
        if link.is_receiver:
            return ProducerLink(conn, link, self.events, self.limits, self.calls)
        start = _start_position(link, self.events.head)
        group = properties.get(GROUP_PROPERTY, address_group)
        event_hubs = uri or names_partition
        if group is None:
            return ConsumerLink(conn, link, self.events, start, event_hubs=event_hubs)
        return self._attach_group(
            conn, link, start, group, properties.get(EPOCH_PROPERTY), event_hubs
        )

    def _attach_group(
        self,
        conn: AmqpConnection,
        link: Link,
        start: Position | None,
        group: Any,
        epoch: Any,
        event_hubs: bool,
    ) -> ConsumerLink:
        """One active link per group (of this user); a higher epoch takes over (seed 4.5.2)."""
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
        key = (user_id, group)
        owner = self._groups.get(key)
        new_epoch = int(epoch) if epoch is not None else 0
        if owner is not None:
            if epoch is None or new_epoch <= owner.epoch:
                raise LinkRefused(
                    RESOURCE_LOCKED,
                    f"consumer group {quote_input(group, 80)} has an active link with epoch"
                    f" {owner.epoch};"
                    " attach with a higher event-streams-epoch to take over",
                )
            owner.conn.detach(owner.link, LINK_STOLEN, f"taken over with epoch {new_epoch}")
        self._groups[key] = _Owner(new_epoch, conn, link)

        def release() -> None:
            current = self._groups.get(key)
            if current is not None and current.link is link:
                del self._groups[key]

        def registered() -> None:
            bus = self._notifications.bus if self._notifications is not None else None
            if bus is not None and binding is not None:
                name = conn.principal.name if conn.principal is not None else None
                bus.publish(CONSUMER_REGISTERED, user=name, component=binding[1], transport="amqp")

        return ConsumerLink(
            conn,
            link,
            self.events,
            start,
            properties={GROUP_PROPERTY: group, EPOCH_PROPERTY: new_epoch},
            binding=binding,
            on_closed=release,
            on_registered=registered,
            event_hubs=event_hubs,
        )


def _parse_address(address: str | None) -> tuple[str | None, bool]:
    """The consumer group an address names, if any, and whether it names the partition:
    ``events``, ``events/Partitions/0`` and ``events/ConsumerGroups/<group>/Partitions/0``
    (Event Hubs' forms; its default group ``$Default`` is no group), also as the path of a
    URI (``amqps://host:port/events``, as Event Hubs clients give it). Raises
    :class:`LinkRefused` for any other address."""
    parts = _address_path(address or "").split("/")
    if parts[0] != NODE or len(parts) not in (1, 3, 5):
        raise LinkRefused(NOT_FOUND, f"no such node: {quote_input(address, 80)}")
    group = None
    if len(parts) == 5:
        if parts[1] != "ConsumerGroups" or not parts[2]:
            raise LinkRefused(NOT_FOUND, f"no such node: {quote_input(address, 80)}")
        group = None if parts[2] == DEFAULT_GROUP else parts[2]
        parts = [parts[0], *parts[3:]]
    if len(parts) == 3:
        if parts[1] != "Partitions":
            raise LinkRefused(NOT_FOUND, f"no such node: {quote_input(address, 80)}")
        if parts[2] != PARTITION:
            raise LinkRefused(
                NOT_FOUND, f"no such partition: {quote_input(parts[2], 40)} (only '0')"
            )
    return group, len(parts) == 3


def _address_path(address: str) -> str:
    """``events/...`` from ``scheme://host[:port]/events/...``; other addresses unchanged."""
    _scheme, sep, rest = address.partition("://")
    return rest.partition("/")[2] if sep else address


def _link_properties(link: Link) -> Mapping[Any, Any]:
    properties = link.remote_properties
    if properties is None:
        return {}
    if not isinstance(properties, Mapping):
        raise LinkRefused(INVALID_FIELD, "link properties must be a map")
    return properties


def _check_partition(properties: Mapping[Any, Any]) -> None:
    partition = properties.get(PARTITION_PROPERTY)
    if partition is None:
        return
    if not isinstance(partition, str):
        raise LinkRefused(INVALID_FIELD, "event-streams-partition must be a symbol")
    if partition != PARTITION:
        raise LinkRefused(
            NOT_FOUND, f"no such partition: {quote_input(partition, 40)} (there is only '0')"
        )


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
    if source is None:
        return None
    data = source.filter
    data.rewind()
    return data.get_object() if data.next() is not None else None


def _open_like_peer(link: Link, properties: Mapping[Any, Any] | None = None) -> None:
    link.source.copy(link.remote_source)
    link.target.copy(link.remote_target)
    link.properties = {PARTITION_PROPERTY: symbol(PARTITION), **(properties or {})}


def _tag(delivery: Delivery) -> str:
    """The delivery tag as proton gives it (it decodes tags as UTF-8); empty when it cannot."""
    try:
        return delivery.tag
    except UnicodeDecodeError:
        return ""


def _reject(delivery: Delivery, condition: str, description: str) -> None:
    delivery.local.condition = Condition(condition, description)
    delivery.update(Delivery.REJECTED)
    delivery.settle()


class ProducerLink:
    """Messages to the node become events; each is settled ``accepted`` once it is durable.

    Credit is kept at the window less the messages still on their way to the store, so a
    producer only waits for credit when the store falls behind.
    """

    def __init__(
        self,
        conn: AmqpConnection,
        link: Link,
        events: EventLog,
        limits: NodeLimits,
        calls: Calls | None = None,
    ):
        self._conn = conn
        self._calls = calls if calls is not None else Calls("amqp")
        self._link = link
        self._events = events
        self._limits = limits
        self._in_store = 0
        self._closed = False
        _open_like_peer(link)
        link.max_message_size = limits.max_message_bytes
        link.open()
        self._top_up()

    def on_flow(self) -> None:
        pass

    def on_writable(self) -> None:
        pass

    def on_closed(self) -> asyncio.Future[None] | None:
        self._closed = True
        return None

    def on_delivery(self, delivery: Delivery) -> None:
        link = self._link
        if delivery.aborted:
            delivery.settle()
            return
        if delivery.pending > self._limits.max_message_bytes:
            self._conn.detach(
                link,
                MESSAGE_SIZE_EXCEEDED,
                f"message larger than {self._limits.max_message_bytes} bytes",
            )
            return
        if delivery.partial:
            return
        started = time.perf_counter()
        raw = link.recv(delivery.pending) or b""
        link.advance()
        try:
            future = self._append(raw, self._conn.is_batch(link.name, _tag(delivery)))
        except BadMessage as exc:
            _reject(delivery, exc.condition, str(exc))
            self._count(exc.condition, started)
        else:
            self._in_store += 1
            future.add_done_callback(lambda done: self._stored(delivery, done, started))
        self._top_up()

    def _append(self, raw: bytes, batch: bool) -> asyncio.Future[Any]:
        """Every event of the message (of each message of a batch) queued for the store, or
        none when one of them cannot be an event."""
        quick = None if batch else quick_event(raw)
        if quick is not None:
            events = [quick]
        elif batch:
            events = [message_to_event(message) for message in batch_messages(raw)]
        else:
            message = Message()
            try:
                message.decode(raw)
            except MessageException as exc:
                raise BadMessage(DECODE_ERROR, f"undecodable message: {exc}") from None
            events = [message_to_event(message)]
        try:
            encoded = [stored_form(event) for event in events]
        except EventRejected as exc:
            raise BadMessage(INVALID_FIELD, str(exc)) from None
        return self._events.append_encoded(encoded)

    def _count(self, outcome: str, started: float) -> None:
        self._calls.observe(NODE, "send", outcome, time.perf_counter() - started)

    def _stored(self, delivery: Delivery, done: asyncio.Future[Any], started: float) -> None:
        self._in_store -= 1
        if self._closed:
            if not done.cancelled():
                done.exception()  # retrieved: nobody is left to tell
            return
        if done.cancelled() or done.exception() is not None:
            _reject(delivery, INTERNAL_ERROR, "the event could not be stored")
            self._count(INTERNAL_ERROR, started)
        else:
            delivery.update(Delivery.ACCEPTED)
            delivery.settle()
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


class _SourceLink:
    """A link the node sends on: a task that waits for credit and something to send."""

    def __init__(
        self,
        conn: AmqpConnection,
        link: Link,
        events: EventLog,
        properties: Mapping[Any, Any] | None = None,
    ) -> None:
        self._conn = conn
        self._link = link
        self._events = events
        self._wake = asyncio.Event()
        self._closed = False
        _open_like_peer(link, properties)
        link.snd_settle_mode = link.remote_snd_settle_mode
        link.open()
        self._task = asyncio.ensure_future(self._run())
        self._task.add_done_callback(self._finished)

    async def _run(self) -> None:
        raise NotImplementedError

    def _finished(self, task: asyncio.Future[None]) -> None:
        if task.cancelled() or self._closed:
            return
        exc = task.exception()
        if exc is not None:
            log.error("AMQP link failed", exc_info=exc)
            self._conn.detach(self._link, INTERNAL_ERROR, "the server could not read events")

    def _send(self, encoded: bytes, tag: str) -> bool:
        """Send one message; True when it is settled already (the peer asked for that)."""
        link = self._link
        delivery = link.delivery(tag)
        link.send(encoded)
        link.advance()
        if link.snd_settle_mode == Link.SND_SETTLED:
            delivery.settle()
            return True
        return False

    def on_flow(self) -> None:
        self._wake.set()

    def on_writable(self) -> None:
        self._wake.set()

    def on_delivery(self, delivery: Delivery) -> None:
        """The consumer's disposition: settle our side too."""
        if delivery.remote_state or delivery.settled:
            delivery.settle()

    def on_closed(self) -> asyncio.Future[None] | None:
        self._closed = True
        self._task.cancel()
        return None


class ConsumerLink(_SourceLink):
    """Events after the start position, one per unit of credit, in id order.

    Bound to a registered consumer, the link starts at its stored position when it has no
    filter, and moves that position as the consumer settles what it was sent: up to just
    before the oldest delivery not yet accepted (or rejected), in one write at a time.
    """

    def __init__(
        self,
        conn: AmqpConnection,
        link: Link,
        events: EventLog,
        start: Position | None,
        *,
        properties: Mapping[Any, Any] | None = None,
        binding: tuple[UserId, str] | None = None,
        on_closed: Callable[[], None] | None = None,
        on_registered: Callable[[], None] | None = None,
        event_hubs: bool = False,
    ) -> None:
        #: Opened through an Event Hubs address: JSON goes out as a ``data`` section.
        self._event_hubs = event_hubs
        #: No filter: events added from now on (seed 3.2), or the bound consumer's position.
        self._start = start if start is not None else Position(events.head)
        self._filtered = start is not None
        self._binding = binding
        self._released = on_closed
        self._registered = on_registered
        self._after = 0
        self._unsettled: deque[int] = deque()
        self._done: set[int] = set()
        self._ack_wanted = 0
        self._acked = 0
        self._acking: asyncio.Task[None] | None = None
        self._stop_listening = events.listen(self._on_head)
        super().__init__(conn, link, events, properties)

    def _on_head(self) -> None:
        self._wake.set()

    def on_closed(self) -> asyncio.Future[None] | None:
        """The detach is answered once the accepted part of what was sent is stored."""
        self._stop_listening()
        if self._released is not None:
            self._released()
        super().on_closed()
        return self._acking

    async def _start_after(self) -> int:
        after = self._start.after_id
        if self._binding is not None:
            user_id, component = self._binding
            if await self._events.register(user_id, component) and self._registered is not None:
                self._registered()
            position = await self._events.position(user_id, component)
            if not self._filtered and position is not None:
                after = position
        if self._start.after_ms is not None:
            after = max(after, await self._events.id_before_ms(self._start.after_ms))
        return after

    async def _run(self) -> None:
        self._after = self._acked = after = await self._start_after()
        link = self._link
        matches = self._start.matches
        encode = _ENCODER.encode
        event_hubs = self._event_hubs
        while True:
            self._wake.clear()
            if link.credit > 0 and self._conn.writable and self._events.head > after:
                batch = await self._events.read_after(after, min(link.credit, READ_BATCH))
                for event in batch:
                    if link.credit <= 0:
                        break
                    after = event.id
                    if matches is None or matches(event):
                        settled = self._send(encode(event, event_hubs), str(event.id))
                        if self._binding is not None and not settled:
                            self._unsettled.append(event.id)
                self._after = after
                if batch:
                    self._acknowledge()
                    self._conn.wake()
                    continue
            if link.credit > 0 and link.drain_mode and self._events.head <= after:
                link.drained()
                self._conn.wake()
            await self._wake.wait()

    def on_delivery(self, delivery: Delivery) -> None:
        if self._binding is not None and delivery.remote_state in (
            Delivery.ACCEPTED,
            Delivery.REJECTED,
        ):
            self._done.add(int(delivery.tag))
            self._acknowledge()
        super().on_delivery(delivery)

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
        while self._ack_wanted > self._acked:
            wanted = self._ack_wanted
            try:
                await self._events.acknowledge(user_id, component, wanted)
            except Exception:
                log.exception("storing the position of %s failed", component)
                return
            self._acked = wanted


class InfoLink(_SourceLink):
    """``events/$info``: one message with the partition bounds per unit of credit."""

    async def _run(self) -> None:
        link = self._link
        sent = 0
        while True:
            self._wake.clear()
            while link.credit > 0:
                bounds = await self._events.bounds()
                sent += 1
                info = Message(body=_info(bounds.first_id, bounds.last_id))
                self._send(info.encode(), str(sent))
                self._conn.wake()
            await self._wake.wait()


def _info(first_id: int | None, last_id: int | None) -> dict[Any, Any]:
    def offset(event_id: int | None) -> Any:
        return symbol(format_offset(event_id)) if event_id is not None else None

    return {
        symbol("partitions"): [
            {
                symbol("partition"): symbol(PARTITION),
                symbol("earliest-offset"): offset(first_id),
                symbol("latest-offset"): offset(last_id),
            }
        ],
        symbol("futoin-evt:head-id"): last_id or 0,
    }
