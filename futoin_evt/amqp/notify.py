"""``$events``: event notification over AMQP (the seed's notification model).

A receiving link from source ``$events`` subscribes to the stream ``events``; from
``$events/NAME``, to every partition of the stream ``NAME`` (``amqp:not-found`` when there is
no such stream, and the link is detached so when its stream is dropped). It needs the read
right on the stream (``amqp:unauthorized-access`` without it, whether the stream exists or
not), and is detached so once that right is revoked; on a
connection that logged in with SAS tokens, one of them must cover ``$events/NAME`` or
``NAME/$events`` (``sb://HOST/NAME`` does). Management events go to it as to an FTN3
subscription: an admin gets all; another user those about a stream they may read now (about
their own consumers, or anyone's with manage there) and those about no stream that are their
own. Its source filter set may hold:

- ``apache.org:selector-filter:string`` (descriptor ``0x0000468C:0x00000004``): a selector;
- ``org.futoin.evt:notification-transformation:map`` (a symbolic descriptor): the
  transformation map ``{requestedAttributes: [names], compact: bool}``;
- a start position, as the event log node takes it: ``event-streams-delivery-annotations``
  (``0x00000000:0x00000200``, a map with ``event-streams-offset`` and/or
  ``event-streams-timestamp``) or ``event-streams-sql`` (``0x00000000:0x00000201``).

Each notification goes out as one message. Without a transformation: subject = event type,
application-properties = every attribute, body = the event data. With one: only the
requested attributes as application-properties (no body); with ``compact``, no subject and
no properties, the body a list of the requested values (null for those missing).

Without a start position the subscription starts at the newest events: it is live. With one,
it reads the stored events from there through its selector and goes on with the live ones,
one reader all along (:class:`~futoin_evt.notify.live.Subscription`, as FTN3's ``after``):
nothing is missed or sent twice where the stored events end. On a stream of several
partitions, a timestamp, an SQL filter and a lone offset hold for every partition (an offset
is a position in each, as on a partition-agnostic consumer of the event log node); the
offset may instead be one per partition, separated by commas in partition order (``12,0,7,3``,
each the last ``id`` seen with that ``partition``, as FTN3's ``after``). Partitions the stream
gains later are read from their first event. Messages are sent as credit allows and are not
acknowledged (nothing is stored for the subscriber).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from ..domain.management import ManagementBus
from ..domain.notification import Notification
from ..domain.partition import DEFAULT_STREAM
from ..domain.rights import Right
from ..domain.stream import EventId, StoredEvent
from ..notify.live import (
    READ_BATCH,
    LiveEvents,
    LiveStreams,
    Subscription,
    UnknownStream,
    management_visible_to,
)
from ..notify.message import NotifyError, Transformation, encoded, real_message
from ..notify.selector import Selector, compile_selector
from ..quoting import quote_input
from .codec import (
    DELIVERY_ANNOTATIONS_FILTER,
    OFFSET_ANNOTATION,
    SELECTOR_FILTER,
    SQL_FILTER,
    BadFilter,
    Position,
    delivery_annotations_start,
    described_filter,
    filter_kind,
)
from .engine.conditions import INVALID_FIELD, NOT_FOUND
from .engine.message import Message
from .engine.session import Link
from .engine.types import EncodeError
from .filters import compile_filter
from .links import SourceLink
from .table import ConnectionView, LinkRefused, address_path

logger = logging.getLogger(__name__)

EVENTS_SOURCE: Final = "$events"
TRANSFORMATION_FILTER: Final = "org.futoin.evt:notification-transformation:map"
_INT64: Final = range(-(1 << 63), 1 << 63)


class NotificationNode:
    """Takes links from ``$events`` and below (the node table sends them here)."""

    def __init__(self, streams: LiveStreams, bus: ManagementBus | None) -> None:
        self._streams = streams
        self.bus = bus

    def attach(self, conn: ConnectionView, link: Link) -> NotificationLink:
        if not link.is_sender:
            raise LinkRefused(NOT_FOUND, "$events is a source: attach a receiving link")
        source = link.remote_source
        address = address_path((source.address if source is not None else None) or EVENTS_SOURCE)
        name = self._stream_name(address)
        stream = name if name is not None else DEFAULT_STREAM
        conn.authorize(link, Right.READ, stream, (address, f"{stream}/{EVENTS_SOURCE}"))
        assert conn.principal is not None
        try:
            lives = self._streams.of_stream(name)
        except UnknownStream as exc:
            raise LinkRefused(NOT_FOUND, str(exc)) from None
        heads = [live.events.head for live in lives]
        selector, transformation, starts = subscription_filters(link, heads)
        visible = management_visible_to(conn.principal, self._streams.access)
        growing = self._streams.growing(name)

        def subscribe(afters: Sequence[int]) -> Subscription:
            positions = list(zip(lives, afters, strict=True))
            return Subscription.of_partitions(positions, self.bus, selector, visible, growing)

        if starts is None:
            starts = [Position(head) for head in heads]
        return NotificationLink(conn, link, lives, starts, subscribe, transformation)

    async def event_types(self, stream: str | None, event_type: str | None) -> dict[str, list[str]]:
        return await self._streams.event_types(stream, event_type)

    @staticmethod
    def _stream_name(address: str) -> str | None:
        """The stream a ``$events[/NAME]`` address (or URI) names; None: ``events``."""
        _node, _slash, name = address_path(address).partition("/")
        return name or None


def subscription_filters(
    link: Link, heads: Sequence[int]
) -> tuple[Selector | None, Transformation | None, list[Position] | None]:
    """The selector, transformation and start positions (one per partition, whose newest ids
    are ``heads``; None: at the newest events) of a link's source filter set."""
    source = link.remote_source
    filters: Any = source.filter if source is not None else None
    if not filters:
        return None, None, None
    if not isinstance(filters, Mapping):
        raise LinkRefused(INVALID_FIELD, "the source filter must be a map")
    selector = transformation = starts = None
    try:
        for value in filters.values():
            descriptor, argument = described_filter(value)
            kind = filter_kind(descriptor)
            if kind == SELECTOR_FILTER:
                if not isinstance(argument, str):
                    raise BadFilter("a selector filter is a string")
                selector = compile_selector(argument)
            elif descriptor == TRANSFORMATION_FILTER:
                transformation = Transformation.parse(argument)
            elif kind is not None:
                these = start_positions(kind, argument, heads)
                if starts is not None:
                    these = [a.both(b) for a, b in zip(starts, these, strict=True)]
                starts = these
            else:
                raise BadFilter(f"filter not supported on $events: {quote_input(descriptor)}")
    except (BadFilter, NotifyError) as exc:
        raise LinkRefused(INVALID_FIELD, str(exc)) from None
    return selector, transformation, starts


def start_positions(kind: tuple[int, str], argument: Any, heads: Sequence[int]) -> list[Position]:
    """Where each partition starts by one of the event log node's position filters: an SQL
    filter, a timestamp or a lone offset holds for every partition; the
    ``event-streams-offset`` of the delivery-annotations filter may instead give one offset
    per partition, separated by commas. :class:`BadFilter` when it cannot be honoured."""
    if kind == SQL_FILTER:
        if not isinstance(argument, str):
            raise BadFilter("an SQL filter is a string")
        return [compile_filter(argument, head=head) for head in heads]
    assert kind == DELIVERY_ANNOTATIONS_FILTER
    offset = argument.get(OFFSET_ANNOTATION) if isinstance(argument, Mapping) else None
    if not isinstance(offset, str) or "," not in offset:
        return [delivery_annotations_start(argument, head=head) for head in heads]
    offsets = offset.split(",")
    if len(offsets) != len(heads):
        raise BadFilter(
            f"event-streams-offset names one offset per partition, {len(heads)} here,"
            f" separated by commas: not {quote_input(offset, 60)}"
        )
    return [
        delivery_annotations_start({**argument, OFFSET_ANNOTATION: one}, head=head)
        for one, head in zip(offsets, heads, strict=True)
    ]


def encode(notification: Notification, transformation: Transformation | None) -> bytes:
    """One notification as an encoded message."""
    shape = real_message(notification, transformation)
    properties = shape.get("properties")
    body = shape.get("body")
    message = Message(
        subject=shape.get("subject"),
        properties=_amqp_values(properties) if properties is not None else None,
        body=[_amqp_value(v) for v in body] if transformation is not None and body else body,
    )
    try:
        return message.encode()
    except EncodeError:  # an integer beyond 64 bits in the body
        message.body = json.dumps(body)
        return message.encode()


def _amqp_value(value: Any) -> Any:
    return str(value) if type(value) is int and value not in _INT64 else value


def _amqp_values(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {name: _amqp_value(value) for name, value in attributes.items()}


class NotificationLink(SourceLink):
    """Matching notifications, one per unit of credit."""

    def __init__(
        self,
        conn: ConnectionView,
        link: Link,
        lives: Sequence[LiveEvents],
        starts: Sequence[Position],
        subscribe: Callable[[Sequence[int]], Subscription],
        transformation: Transformation | None,
    ) -> None:
        self._lives = list(lives)
        self._starts = list(starts)
        self._subscribe = subscribe
        self._subscription: Subscription | None = None
        self._transformation = transformation
        super().__init__(conn, link, lives[0].events)

    def on_flow(self) -> None:
        if self._subscription is not None:
            self._subscription.wake.set()

    def on_writable(self) -> None:
        if self._subscription is not None:
            self._subscription.wake.set()

    def on_closed(self) -> Any:
        if self._subscription is not None:
            self._subscription.close()
        return super().on_closed()

    async def _run(self) -> None:
        afters = [
            await self._after_time(live.events, start, start.after_id)
            for live, start in zip(self._lives, self._starts, strict=True)
        ]
        if self._closed:
            return
        subscription = self._subscription = self._subscribe(afters).start()
        #: What an SQL filter lets through, by partition (those it bounds only).
        matches = {n: s.matches for n, s in enumerate(self._starts) if s.matches is not None}
        link = self._link
        form = ("amqp", self._transformation)  # encoded once per shape, for every subscriber
        sent = 0
        while True:
            subscription.wake.clear()
            gone = subscription.gone
            if gone is not None:  # the stream was dropped: as for a stream that is not there
                self._conn.detach(link, NOT_FOUND, str(gone))
                return
            if link.credit > 0 and self._conn.writable:
                if subscription.has_more():
                    batch = await subscription.poll(min(link.credit, READ_BATCH))
                    for notification in batch:
                        if matches and not _let_through(notification, matches):
                            continue
                        sent += 1
                        self._send(encoded(notification, form, encode), str(sent))
                    self._conn.wake()
                    continue
                if link.drain:
                    link.drained()
                    self._conn.wake()
            await subscription.wake.wait()


def _let_through(
    notification: Notification, matches: Mapping[int, Callable[[StoredEvent], bool]]
) -> bool:
    """Whether the position filter of the notification's partition lets it through (a
    management event, in no partition, always)."""
    event_id, partition = notification.id, notification.partition
    if event_id is None or partition is None or partition not in matches:
        return True
    return matches[partition](
        StoredEvent(EventId(event_id), notification.type, "", notification.ts)
    )
