"""What GET-EVENTS answers: each event type and its attribute names.

Management event types come from their declarations. The log's types come from the events
themselves: the catalog follows the log from where it last looked, reading (and parsing)
each event once. Events that live subscribers read are noted on the way at no extra cost;
the rest are read when someone asks. On first use the catalog looks at the newest
:data:`FIRST_LOOK` events, and after a long quiet spell at most that many again, so an answer
never waits for the whole log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Final

from ..domain.management import DECLARED, attribute_names
from ..domain.notification import BASE_ATTRIBUTES, Notification
from ..log.eventlog import EventLog

#: Events looked at when the catalog starts, or is far behind the log.
FIRST_LOOK: Final = 10_000
_READ_BATCH: Final = 1000
_SCALARS: Final = (str, int, float, bool)


class EventCatalog:
    def __init__(self, events: EventLog) -> None:
        self._events = events
        self._types: dict[str, dict[str, None]] = {}
        #: Every event up to here has been noted (-1: not started).
        self._seen_up_to = -1
        self._catching_up: asyncio.Future[None] | None = None

    def note(
        self, notifications: Iterable[Notification], read: tuple[int, int] | None = None
    ) -> None:
        """Note the attributes of events read anyway. ``read`` is (after, up to) when they
        are every event in that range: what was seen then extends over it."""
        types = self._types
        for notification in notifications:
            attributes = types.get(notification.type)
            if attributes is None:
                attributes = types[notification.type] = dict.fromkeys(BASE_ATTRIBUTES)
            data = notification.data
            if type(data) is dict:
                for name, value in data.items():
                    if name not in attributes and (value is None or isinstance(value, _SCALARS)):
                        attributes[name] = None
        if read is not None and 0 <= read[0] <= self._seen_up_to:
            self._seen_up_to = max(self._seen_up_to, read[1])

    @property
    def seen_up_to(self) -> int:
        return self._seen_up_to

    async def event_types(self, event_type: str | None = None) -> dict[str, list[str]]:
        """Event type -> attribute names; only ``event_type`` when given (empty when it is
        unknown)."""
        await self._catch_up()
        result = {name: attribute_names(name) for name in DECLARED}
        result.update({name: list(attributes) for name, attributes in self._types.items()})
        if event_type is not None:
            return {event_type: result[event_type]} if event_type in result else {}
        return result

    async def _catch_up(self) -> None:
        if self._catching_up is None or self._catching_up.done():
            self._catching_up = asyncio.ensure_future(self._read_new())
        await asyncio.shield(self._catching_up)

    async def _read_new(self) -> None:
        head = self._events.head
        after = max(self._seen_up_to, head - FIRST_LOOK, 0)
        self._seen_up_to = max(self._seen_up_to, after)
        while after < head:
            batch, reached = await self._events.read_of_types(after, _READ_BATCH, None)
            partition = self._events.partition
            self.note((Notification.of(e, partition) for e in batch), (after, reached))
            if reached <= after:
                break
            after = reached
