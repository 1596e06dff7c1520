"""A notification: one event as the virtual message a subscriber's selector reads.

Its subject is its event type. Its attributes are ``eventType``, ``id``, ``ts``, ``stream``
and ``partition`` (where the event is: its id counts within that partition) and, when the
data is a JSON object, each top-level field whose value is a string, number, boolean or
null. The five base attributes win over data fields of the same name. Management events
(:mod:`.management`) are in no log: they have no ``id``, and ``stream`` and ``partition``
only when they concern a partition. The selectors, the transformations and the doors'
messages are :mod:`futoin_evt.notify`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from ..ftn3.messages import decode_json
from .partition import DEFAULT_PARTITION, Partition
from .stream import StoredEvent

#: An attribute value: what a selector compares and a message carries. None is NULL.
Value = str | int | float | bool | None

EVENT_TYPE: Final = "eventType"
ID: Final = "id"
TS: Final = "ts"
STREAM: Final = "stream"
PARTITION: Final = "partition"
#: The attributes every event of the log has, in this order.
BASE_ATTRIBUTES: Final = (EVENT_TYPE, ID, TS, STREAM, PARTITION)
#: The types of a data field's value that make it an attribute (or None).
SCALARS: Final = frozenset({str, int, float, bool})


@dataclass(frozen=True, slots=True)
class Notification:
    """One event as its virtual notification message. ``id`` is None for management events,
    which are not in a log; ``stream`` and ``partition`` too unless they concern one."""

    type: str
    id: int | None
    ts: str
    data: Any
    stream: str | None = None
    partition: int | None = None
    #: What doors encoded it to, by (door, transformation): each subscriber of the same
    #: shape sends the same bytes (see :func:`futoin_evt.notify.message.encoded`).
    forms: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, event: StoredEvent, partition: Partition = DEFAULT_PARTITION) -> Notification:
        return cls(
            event.type,
            event.id,
            event.ts,
            decode_json(event.data_json.encode()),  # orjson where it gives the same
            partition.stream,
            partition.number,
        )

    def attributes(self) -> dict[str, Value]:
        """Every attribute, in order: the base ones, then the data's scalar fields."""
        result: dict[str, Value] = {EVENT_TYPE: self.type}
        if self.id is not None:
            result[ID] = self.id
        result[TS] = self.ts
        if self.stream is not None:
            result[STREAM] = self.stream
            result[PARTITION] = self.partition
        data = self.data
        if type(data) is dict:
            for name, value in data.items():
                if name not in result and (value is None or type(value) in SCALARS):
                    result[name] = value
        return result
