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

from ..domain.stream import utc_timestamp
from .message import EVENT_TYPE, TS, Notification, Value

log = logging.getLogger(__name__)

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
    CONSUMER_REGISTERED: ("user", "component", "transport"),
    CONSUMER_DROPPED: ("user", "component", "by", "reason"),
    CONSUMER_EXPIRED: ("stream", "partition", "user", "component", "reason"),
    CONSUMER_TAKEN_OVER: ("user", "component", "transport", "epoch", "reason"),
    EVENTS_DISCARDED: ("stream", "partition", "count", "upToId", "reason"),
    PUSH_RETRY: ("user", "component", "seq", "attempts", "delaySeconds", "reason"),
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


class ManagementBus:
    """An in-process fan-out of management events to the listeners of the moment."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []
        #: Management events published, by type (metrics).
        self.published: dict[str, int] = {}

    @property
    def active(self) -> bool:
        """True while someone listens: only then is an event worth building."""
        return bool(self._listeners)

    def listen(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` with each management event; returns how to stop."""
        self._listeners = [*self._listeners, listener]

        def stop() -> None:
            self._listeners = [other for other in self._listeners if other is not listener]

        return stop

    def publish(self, event_type: str, **attributes: Value) -> None:
        """Tell the listeners; ``event_type`` is one of :data:`DECLARED`."""
        self.published[event_type] = self.published.get(event_type, 0) + 1
        listeners = self._listeners
        if not listeners:
            return
        notification = Notification(event_type, None, utc_timestamp(), attributes)
        for listener in listeners:
            try:
                listener(notification)
            except Exception:  # one subscriber's fault is not the publisher's
                log.exception("a management event listener failed")
