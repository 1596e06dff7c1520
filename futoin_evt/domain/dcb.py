"""The DCB store's values: events with tags, queries, append conditions, the two refusals of
an append, and the rules of a DCB event (its type, id, tags and size: :func:`new_event`).
Storage, the DCB service and every DCB door share them; parsing requests into them is
:mod:`futoin_evt.dcb.model`'s."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ..ftn3.messages import encode_json
from ..quoting import quote_input
from .stream import BadInput

TYPE_RE: Final = re.compile(r"[\w.:\-]{1,200}", re.ASCII)
EVENT_ID_RE: Final = re.compile(r"[\w\-]{1,100}", re.ASCII)
TAG_PART_RE: Final = re.compile(r"[a-zA-Z0-9\-_]{1,50}")
#: Bounds on one request, so a query or a batch cannot cost without limit.
MAX_EVENTS_PER_APPEND: Final = 1000
MAX_QUERY_ITEMS: Final = 100
MAX_ITEM_VALUES: Final = 100
MAX_TAGS_PER_EVENT: Final = 100
#: The largest JSON text of one event's data.
MAX_DATA_BYTES: Final = 1024 * 1024
#: Event types and tags (``str`` only) that passed their checks.
_CHECKED_TYPES: Final[set[str]] = set()
_CHECKED_TAGS: Final[set[str]] = set()
_MAX_CHECKED: Final = 4096
#: The rules above in words, for the refusals.
DCB_TYPE_RULE: Final = (
    "a DCB event type is 1 to 200 characters of letters, digits, _ . : and -, e.g. CourseDefined"
)
DCB_EVENT_ID_RULE: Final = "an event id is 1 to 100 characters of letters, digits, _ and -"
DCB_TAG_RULE: Final = (
    "a tag is key or key:value, each part 1 to 50 characters of letters, digits, _ and -,"
    " e.g. course:c1"
)


class DcbInputError(BadInput):
    """A request the DCB API refuses; ``field`` is where in the request the fault is."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def new_event(
    event_type: str, data: Any, tags: Sequence[str] = (), event_id: str | None = None
) -> NewEvent:
    """Check one event; ``data`` is any JSON value, or ``bytes`` kept exactly."""
    check_type(event_type, "type")
    if event_id is not None and (
        not isinstance(event_id, str) or EVENT_ID_RE.fullmatch(event_id) is None
    ):
        raise DcbInputError(
            "id", f"{quote_input(event_id)} is not an event id: {DCB_EVENT_ID_RULE}"
        )
    checked_tags = check_tags(tags, "tags", allow_empty=True)
    if isinstance(data, (bytes, bytearray, memoryview)):
        text = '"' + base64.b64encode(bytes(data)).decode("ascii") + '"'
        is_bytes = True
    else:
        try:
            text = encode_json(data)
        except (TypeError, ValueError, RecursionError) as exc:
            raise DcbInputError("data", f"not JSON: {exc}") from None
        is_bytes = False
    if len(text) > MAX_DATA_BYTES // 4 and len(text.encode()) > MAX_DATA_BYTES:
        raise DcbInputError("data", f"larger than {MAX_DATA_BYTES} bytes")
    return NewEvent(event_type, text, checked_tags, event_id, is_bytes)


def check_type(value: Any, field: str) -> str:
    if type(value) is str and value in _CHECKED_TYPES:
        return value
    if not isinstance(value, str) or TYPE_RE.fullmatch(value) is None:
        raise DcbInputError(field, f"{quote_input(value)} is not an event type: {DCB_TYPE_RULE}")
    _remember(_CHECKED_TYPES, value)
    return value


def check_tags(value: Any, field: str, *, allow_empty: bool = False) -> tuple[str, ...]:
    tags = list_of(value, field, MAX_TAGS_PER_EVENT)
    if not tags and not allow_empty:
        raise DcbInputError(field, "at least one tag")
    checked = _CHECKED_TAGS
    for index, tag in enumerate(tags):
        if type(tag) is str and tag in checked:
            continue
        if not isinstance(tag, str) or not all(
            TAG_PART_RE.fullmatch(part) for part in tag.split(":", 1)
        ):
            raise DcbInputError(
                f"{field}[{index}]",
                f"{quote_input(tag)} is not a tag: {DCB_TAG_RULE}",
            )
        _remember(checked, tag)
    if len(tags) == 1:
        return (tags[0],)
    return tuple(dict.fromkeys(tags))  # a repeated tag counts once


def _remember(checked: set[str], value: str) -> None:
    """Keep a value that passed its check (types and tags repeat from call to call): the
    next call skips the check. Bounded: a full memo starts over."""
    if len(checked) >= _MAX_CHECKED:
        checked.clear()
    checked.add(value)


def list_of(value: Any, field: str, most: int) -> list[Any]:
    if type(value) is list:
        if len(value) > most:
            raise DcbInputError(field, f"at most {most} entries")
        return value
    if isinstance(value, tuple):
        value = list(value)  # from the Python API
    if not isinstance(value, list):
        raise DcbInputError(field, "a list is needed")
    if len(value) > most:
        raise DcbInputError(field, f"at most {most} entries")
    return value


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
class SequencedEvent:
    """An event read back, with its position in the one log."""

    position: int
    type: str
    data_json: str
    tags: tuple[str, ...]
    ts: str
    id: str | None = None
    is_bytes: bool = False
    #: ``tags`` as a JSON array, when the store read them in that form (spliced into
    #: :meth:`to_json` as they are); None: encoded from ``tags``.
    tags_json: str | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> str:
        """The wire form: ``{"position", "type", "data", "tags", "id"?, "bytes"?, "ts"}``, the
        data spliced in as stored (opaque bytes: base64 text, with ``"bytes": true``)."""
        extra = f',"id":{encode_json(self.id)}' if self.id is not None else ""
        if self.is_bytes:
            extra += ',"bytes":true'
        tags = self.tags_json
        if tags is None:
            tags = encode_json(list(self.tags))
        return (
            f'{{"position":{self.position},"type":{encode_json(self.type)},'
            f'"data":{self.data_json},"tags":{tags}{extra},"ts":"{self.ts}"}}'
        )
