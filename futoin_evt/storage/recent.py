"""The newest events this process committed, kept in memory for readers at the tail.

Push streams and pollers that are caught up read what was just committed; serving that from
memory saves a round trip to the database thread per group. The ring only ever holds a run of
consecutive ids: when an id is missing (another process added events to the file) it starts
over, and a read it cannot answer in full goes to the database.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

DEFAULT_CAPACITY: Final = 8192
#: The ring's bound in bytes of event JSON, whatever the count (large events keep fewer).
DEFAULT_MAX_BYTES: Final = 32 * 1024 * 1024


class RecentEvent(NamedTuple):
    id: int
    type: str
    json: str
    #: UTF-8 length of ``json``.
    size: int
    #: The type is an FTN18 EventType (FTN18 consumers see no other events).
    ftn18: bool = True


class RecentEvents:
    def __init__(
        self, capacity: int = DEFAULT_CAPACITY, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> None:
        self._ring: deque[RecentEvent] = deque()
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0

    @property
    def first_id(self) -> int:
        return self._ring[0].id if self._ring else 0

    @property
    def last_id(self) -> int:
        return self._ring[-1].id if self._ring else 0

    def extend(self, events: Sequence[RecentEvent]) -> None:
        if not events:
            return
        if self._ring and events[0].id != self._ring[-1].id + 1:
            self.clear()  # a gap: someone else committed in between
        self._ring.extend(events)
        self._bytes += sum(event.size for event in events)
        while len(self._ring) > self._capacity or self._bytes > self._max_bytes:
            self._bytes -= self._ring.popleft().size

    def clear(self) -> None:
        self._ring.clear()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def forget_up_to(self, event_id: int) -> None:
        """Discarded events: readers must not get them from here either."""
        while self._ring and self._ring[0].id <= event_id:
            self._bytes -= self._ring.popleft().size

    def covers(self, after_id: int) -> bool:
        """True when every event after ``after_id`` up to :attr:`last_id` is here, and there
        is at least one (an empty answer could miss events from other processes)."""
        return bool(self._ring) and self._ring[0].id <= after_id + 1 <= self._ring[-1].id

    def after(self, after_id: int) -> Iterator[RecentEvent]:
        """The events after ``after_id`` in id order (when :meth:`covers` is true)."""
        return itertools.islice(self._ring, max(after_id + 1 - self._ring[0].id, 0), None)
