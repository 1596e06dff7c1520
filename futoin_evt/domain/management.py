"""Management events: what the server itself does, told to live subscribers only.

They are named with the reverse domain prefix :data:`PREFIX` (the seed asks for one) and are
never written to the log. :class:`ManagementBus` hands each to the subscribers that listen
at the moment; with none, :meth:`ManagementBus.publish` returns at once, and callers that
would have to work to build the attributes check :attr:`ManagementBus.active` first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

from .notification import EVENT_TYPE, PARTITION, STREAM, TS, Notification, Value
from .stream import utc_timestamp

logger = logging.getLogger(__name__)

PREFIX: Final = "org.futoin.evt."

CONSUMER_REGISTERED: Final = PREFIX + "consumerRegistered"
CONSUMER_DROPPED: Final = PREFIX + "consumerDropped"
CONSUMER_EXPIRED: Final = PREFIX + "consumerExpired"
CONSUMER_TAKEN_OVER: Final = PREFIX + "consumerTakenOver"
EVENTS_DISCARDED: Final = PREFIX + "eventsDiscarded"
PUSH_RETRY: Final = PREFIX + "pushRetry"
CONNECTION_OPENED: Final = PREFIX + "connectionOpened"
CONNECTION_CLOSED: Final = PREFIX + "connectionClosed"
AUTH_FAILED: Final = PREFIX + "authFailed"

#: Each management event type and its declared attributes (besides eventType and ts).
#: ``user`` and ``component`` name a consumer; ``transport`` is ``ws``, ``amqp`` or ``http``;
#: ``peer`` is the remote address; counts are numbers; ``reason`` is one sentence; ``stream``
#: and ``partition`` (a number) name the partition whose log it concerns.
DECLARED: Final[dict[str, tuple[str, ...]]] = {
    CONSUMER_REGISTERED: ("stream", "partition", "user", "component", "transport"),
    CONSUMER_DROPPED: ("stream", "partition", "user", "component", "by", "reason"),
    CONSUMER_EXPIRED: ("stream", "partition", "user", "component", "reason"),
    CONSUMER_TAKEN_OVER: (
        "stream",
        "partition",
        "user",
        "component",
        "transport",
        "epoch",
        "reason",
    ),
    EVENTS_DISCARDED: ("stream", "partition", "count", "upToId", "reason"),
    PUSH_RETRY: (
        "stream",
        "partition",
        "user",
        "component",
        "seq",
        "attempts",
        "delaySeconds",
        "reason",
    ),
    CONNECTION_OPENED: ("transport", "peer", "user"),
    CONNECTION_CLOSED: ("transport", "peer", "user", "reason"),
    AUTH_FAILED: ("peer", "user", "reason"),
}


def is_management_type(event_type: str) -> bool:
    return event_type.startswith(PREFIX)


def attribute_names(event_type: str) -> list[str]:
    """What GET-EVENTS lists for a management event type."""
    return [EVENT_TYPE, TS, *DECLARED[event_type]]


Listener = Callable[[Notification], None]


def management_notification(event_type: str, ts: str, attributes: dict[str, Value]) -> Notification:
    """A management event as a notification: ``stream`` and ``partition``, where it has them,
    are the notification's own (as a log event's are), the rest its data."""
    data = dict(attributes)
    stream = data.pop(STREAM, None)
    partition = data.pop(PARTITION, None)
    return Notification(
        event_type,
        None,
        ts,
        data,
        str(stream) if stream is not None else None,
        int(partition) if isinstance(partition, int) else None,
    )


def management_attributes(notification: Notification) -> dict[str, Value]:
    """The attributes :func:`management_notification` was given (to publish them again)."""
    attributes = dict(notification.data)
    if notification.stream is not None:
        attributes[STREAM] = notification.stream
        attributes[PARTITION] = notification.partition
    return attributes


class ManagementBus:
    """An in-process fan-out of management events to the listeners of the moment."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        #: Management events published, by type (metrics).
        self.published: dict[str, int] = {}
        #: Also told of each event published here: the other workers of the server, whose
        #: subscribers get it through :meth:`deliver`.
        self.relay: Listener | None = None

    @property
    def active(self) -> bool:
        """True while someone listens: only then is an event worth building."""
        return bool(self._listeners) or self.relay is not None

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with each management event; returns how to stop."""
        self._listeners = [*self._listeners, listener]

        def stop() -> None:
            self._listeners = [other for other in self._listeners if other is not listener]

        return stop

    def publish(self, event_type: str, **attributes: Value) -> None:
        """Tell the listeners; ``event_type`` is one of :data:`DECLARED`."""
        self.published[event_type] = self.published.get(event_type, 0) + 1
        if not self.active:
            return
        notification = management_notification(event_type, utc_timestamp(), attributes)
        if self.relay is not None:
            self.relay(notification)
        self.deliver(notification)

    def deliver(self, notification: Notification) -> None:
        """Tell the listeners here of an event published here or by another worker."""
        for listener in self._listeners:
            try:
                listener(notification)
            except Exception:  # one subscriber's fault is not the publisher's
                logger.exception("a management event listener failed")
