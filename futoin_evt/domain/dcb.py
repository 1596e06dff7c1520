"""The DCB store's values: events with tags, queries, append conditions, and the two
refusals of an append. Storage, the DCB service and every DCB door share them; parsing
requests into them is :mod:`futoin_evt.dcb.model`'s."""

from __future__ import annotations

import base64
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from ..ftn3.messages import encode_json


class AppendConditionFailed(Exception):
    """An event matching the condition's query exists after its ``after`` position."""

    def __init__(self, position: int) -> None:
        super().__init__(f"an event at position {position} matches the append condition")
        self.position = position


class EventIdConflict(Exception):
    """An event id that is stored already, with other content."""

    def __init__(self, event_id: str) -> None:
        super().__init__(f"event id {event_id} is stored already with other content")
        self.event_id = event_id


class EventIdTaken(EventIdConflict):
    """An id of a :class:`BlindAppend` is stored already: the same answer whatever the
    stored event's content (a retry of the writer's own append included)."""

    def __init__(self, event_id: str) -> None:
        super().__init__(event_id)
        self.args = (f"event id {event_id} is taken",)


@dataclass(frozen=True, slots=True)
class QueryItem:
    """Matches an event whose type is one of ``types`` (any, when empty) and which carries
    every tag in ``tags`` and, for each of ``tag_keys``, some tag of that key."""

    types: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()
    tag_keys: frozenset[str] = frozenset()

    def matches(self, event_type: str, event_tags: frozenset[str]) -> bool:
        if self.types and event_type not in self.types:
            return False
        if not self.tags <= event_tags:
            return False
        return all(
            any(tag == key or tag.startswith(key + ":") for tag in event_tags)
            for key in self.tag_keys
        )


@dataclass(frozen=True, slots=True)
class Query:
    """A disjunction of items; no items match every event."""

    items: tuple[QueryItem, ...] = ()

    @property
    def matches_all(self) -> bool:
        return not self.items or any(not (i.types or i.tags or i.tag_keys) for i in self.items)

    def matches(self, event_type: str, event_tags: Iterable[str]) -> bool:
        tags = frozenset(event_tags)
        return self.matches_all or any(item.matches(event_type, tags) for item in self.items)


MATCH_ALL: Final = Query()


@dataclass(frozen=True, slots=True)
class AppendCondition:
    """Fail when an event after ``after`` (any event, when None) matches the query."""

    fail_if_events_match: Query
    after: int | None = None


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to append. ``data_json`` is the stored JSON text of the data; for opaque bytes
    (``is_bytes``) it is a JSON string of their base64."""

    type: str
    data_json: str
    tags: tuple[str, ...] = ()
    id: str | None = None
    is_bytes: bool = False

    def same_content(self, other: NewEvent) -> bool:
        """An idempotent retry: the same id with the same type, data and tags."""
        return (self.type, self.data_json, sorted(self.tags), self.is_bytes) == (
            other.type,
            other.data_json,
            sorted(other.tags),
            other.is_bytes,
        )

    @property
    def data_bytes(self) -> bytes:
        """The data as bytes: the opaque bytes given, or the JSON text in UTF-8."""
        if self.is_bytes:
            return base64.b64decode(self.data_json[1:-1])
        return self.data_json.encode()


class BlindAppend(tuple[NewEvent, ...]):
    """The events of an append whose writer may not read the stream. The store judges it as
    if it knew nothing stored: an id stored before is :class:`EventIdTaken` (the append's
    first stored id), never a retry answered with the stored position."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event read back, with its position in the one log."""

    position: int
    type: str
    data_json: str
    tags: tuple[str, ...]
    ts: str
    id: str | None = None
    is_bytes: bool = False

    def to_json(self) -> str:
        """The wire form: ``{"position", "type", "data", "tags", "id"?, "bytes"?, "ts"}``, the
        data spliced in as stored (opaque bytes: base64 text, with ``"bytes": true``)."""
        extra = f',"id":{encode_json(self.id)}' if self.id is not None else ""
        if self.is_bytes:
            extra += ',"bytes":true'
        return (
            f'{{"position":{self.position},"type":{encode_json(self.type)},'
            f'"data":{self.data_json},"tags":{encode_json(list(self.tags))}{extra},'
            f'"ts":"{self.ts}"}}'
        )
