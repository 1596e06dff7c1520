"""``$events``: event notification over AMQP (the seed's notification model).

A receiving link from source ``$events`` subscribes to the stream ``events``; from
``$events/NAME``, to every partition of the stream ``NAME`` (``amqp:not-found`` when there is
no such stream). Its source filter set may hold:

- ``apache.org:selector-filter:string`` (descriptor ``0x0000468C:0x00000004``): a selector;
- ``org.futoin.evt:notification-transformation:map`` (a symbolic descriptor): the
  transformation map ``{requestedAttributes: [names], compact: bool}``.

Each notification goes out as one message. Without a transformation: subject = event type,
application-properties = every attribute, body = the event data. With one: only the
requested attributes as application-properties (no body); with ``compact``, no subject and
no properties, the body a list of the requested values (null for those missing).

The subscription starts at the newest events: it is live. Messages are sent as credit allows
and are not acknowledged (nothing is stored for the subscriber).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from ..notify.live import (
    READ_BATCH,
    LiveStreams,
    Subscription,
    UnknownStream,
    management_visible_to,
)
from ..notify.management import ManagementBus
from ..notify.message import Notification, NotifyError, Transformation, real_message
from ..notify.selector import Selector, compile_selector
from ..quoting import quote_input
from .codec import SELECTOR_FILTER, BadFilter, described_filter
from .engine.connection import Link
from .engine.message import Message
from .engine.types import EncodeError
from .links import SourceLink
from .table import Connection, LinkRefused, address_path

log = logging.getLogger(__name__)

EVENTS_SOURCE: Final = "$events"
TRANSFORMATION_FILTER: Final = "org.futoin.evt:notification-transformation:map"
INVALID_FIELD: Final = "amqp:invalid-field"
NOT_FOUND: Final = "amqp:not-found"
_INT64: Final = range(-(1 << 63), 1 << 63)


class NotificationNode:
    """Takes links from ``$events`` and below (the node table sends them here)."""

    def __init__(self, streams: LiveStreams, bus: ManagementBus | None) -> None:
        self._streams = streams
        self.bus = bus

    def attach(self, conn: Connection, link: Link) -> NotificationLink:
        if not link.is_sender:
            raise LinkRefused(NOT_FOUND, "$events is a source: attach a receiving link")
        assert conn.principal is not None
        source = link.remote_source
        name = self._stream_name((source.address if source is not None else None) or EVENTS_SOURCE)
        try:
            lives = self._streams.of_stream(name)
        except UnknownStream as exc:
            raise LinkRefused(NOT_FOUND, str(exc)) from None
        selector, transformation = subscription_filters(link)
        subscription = Subscription.of_partitions(
            [(live, live.events.head) for live in lives],
            self.bus,
            selector,
            management_visible_to(conn.principal),
            self._streams.growing(name),
        )
        return NotificationLink(conn, link, subscription, transformation)

    async def event_types(self, stream: str | None, event_type: str | None) -> dict[str, list[str]]:
        return await self._streams.event_types(stream, event_type)

    @staticmethod
    def _stream_name(address: str) -> str | None:
        """The stream a ``$events[/NAME]`` address (or URI) names; None: ``events``."""
        _node, _slash, name = address_path(address).partition("/")
        return name or None


def subscription_filters(link: Link) -> tuple[Selector | None, Transformation | None]:
    """The selector and transformation of a link's source filter set."""
    source = link.remote_source
    filters: Any = source.filter if source is not None else None
    if not filters:
        return None, None
    if not isinstance(filters, Mapping):
        raise LinkRefused(INVALID_FIELD, "the source filter must be a map")
    selector = transformation = None
    try:
        for value in filters.values():
            descriptor, argument = described_filter(value)
            if descriptor in SELECTOR_FILTER:
                if not isinstance(argument, str):
                    raise BadFilter("a selector filter is a string")
                selector = compile_selector(argument)
            elif descriptor == TRANSFORMATION_FILTER:
                transformation = Transformation.parse(argument)
            else:
                raise BadFilter(f"filter not supported on $events: {quote_input(descriptor)}")
    except (BadFilter, NotifyError) as exc:
        raise LinkRefused(INVALID_FIELD, str(exc)) from None
    return selector, transformation


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
        conn: Connection,
        link: Link,
        subscription: Subscription,
        transformation: Transformation | None,
    ) -> None:
        self._subscription = subscription
        self._transformation = transformation
        super().__init__(conn, link, subscription.live.events)

    def on_flow(self) -> None:
        self._subscription.wake.set()

    def on_writable(self) -> None:
        self._subscription.wake.set()

    def on_closed(self) -> Any:
        self._subscription.close()
        return super().on_closed()

    async def _run(self) -> None:
        link = self._link
        subscription = self._subscription.start()
        sent = 0
        while True:
            subscription.wake.clear()
            if link.credit > 0 and self._conn.writable:
                if subscription.has_more():
                    batch = await subscription.poll(min(link.credit, READ_BATCH))
                    for notification in batch:
                        sent += 1
                        self._send(encode(notification, self._transformation), str(sent))
                    self._conn.wake()
                    continue
                if link.drain:
                    link.drained()
                    self._conn.wake()
            await subscription.wake.wait()
