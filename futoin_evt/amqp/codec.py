"""AMQP messages to events and back; offsets; the event-streams delivery-annotations filter.

No I/O. An event's type is the message ``subject``; its data is the ``amqp-value`` body (any
AMQP value JSON can hold), a ``data`` section with ``application/json``, or opaque bytes. Opaque
bytes are stored as ``{"$binary": "<base64>"}``. An event that came as a ``data`` section keeps
its content type (and JSON its text, when it is one line), and goes back out as it came. The
application property :data:`KEY_PROPERTY` is the producer's key of the event (see
:mod:`futoin_evt.storage.dedup`).

The message annotation ``x-opt-partition-key`` (or the event streams draft's
``event-streams-group-key``) and the other application properties are the event's attributes
(:mod:`futoin_evt.domain.attrs`): its key and its properties, in the order sent, stored with
it and sent back with it. A property keeps its value: text, a number, a boolean, null,
binary (bytes). What JSON has no room for is kept as text: a symbol or a char as its string,
a uuid in its canonical form, a timestamp in ISO 8601 UTC with milliseconds
(``2026-01-02T03:04:05.678Z``). A decimal, a list, a map, an array or a described value is
refused (``amqp:invalid-field``; AMQP gives application properties simple values only). On
the way out, an event's key is the ``x-opt-partition-key`` annotation (bytes as binary) and
its properties the application properties (bytes as binary; of a name that repeats, the last
value; of verbatim Kafka headers, not ``ce_type`` and ``content-type``: the subject and the
content type carry them). Event Hubs' SDK reads them as ``EventData.partition_key`` and
``EventData.properties``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Final, NamedTuple, Protocol

from ..domain.attrs import EventAttrs, parse_attrs
from ..domain.payload import (
    BINARY_KEY,
    JSON_CONTENT_TYPE,
    MAX_CONTENT_TYPE_CHARS,
    PayloadNotJson,
    is_json_content_type,
    payload_draft,
)
from ..domain.stream import EventDraft, StoredEvent
from ..ftn3.messages import decode_json
from ..quoting import quote_input
from .engine.message import Message, decode_message
from .engine.types import (
    Array,
    Decimal32,
    Decimal64,
    Decimal128,
    DecodeError,
    Described,
    EncodeError,
    Symbol,
    Timestamp,
    ULong,
    decode_value,
    encode,
)

#: Width of ``event-streams-offset``: every event id fits, so text order is id order.
OFFSET_WIDTH: Final = 20
EARLIEST: Final = "@earliest"
LATEST: Final = "@latest"
#: The type of an event from a message without a subject (Event Hubs clients send none).
DEFAULT_EVENT_TYPE: Final = "EVENT"
#: The application property that carries the producer's key of an event: within the dedup
#: window, a message with a key already stored in its partition stores nothing and is
#: accepted (not the message-id: clients set that for their own ends, and one set to the
#: same value for different messages would lose events).
KEY_PROPERTY: Final = "futoin-evt-key"
_DATA_SECTION: Final = 0x75
#: Event Hubs' batch message format: each ``data`` section of the body is a whole message.
BATCH_FORMAT: Final = 0x8001_3700

#: Message annotations naming a partition key, the first found taken (Event Hubs', and the
#: event streams draft's): it routes a message, and is the event's key.
PARTITION_KEYS: Final = (Symbol("x-opt-partition-key"), Symbol("event-streams-group-key"))
#: Of verbatim Kafka headers, those a message carries elsewhere (the subject, the content
#: type): not sent as application properties.
_CARRIED_HEADERS: Final = frozenset(("ce_type", "content-type"))
OFFSET_ANNOTATION: Final = Symbol("event-streams-offset")
TIMESTAMP_ANNOTATION: Final = Symbol("event-streams-timestamp")
EH_OFFSET: Final = Symbol("x-opt-offset")
EH_SEQUENCE: Final = Symbol("x-opt-sequence-number")
EH_ENQUEUED: Final = Symbol("x-opt-enqueued-time")

DELIVERY_ANNOTATIONS_FILTER: Final = (
    0x0000_0000_0000_0200,
    "amqp:event-streams-delivery-annotations-filter",
)
SQL_FILTER: Final = (0x0000_0000_0000_0201, "amqp:event-streams-sql-filter")
SELECTOR_FILTER: Final = (0x0000_468C_0000_0004, "apache.org:selector-filter:string")


class BadMessage(ValueError):
    """A message that cannot become an event; ``condition`` is the AMQP error to reject with."""

    def __init__(self, condition: str, description: str) -> None:
        super().__init__(description)
        self.condition = condition


class BadFilter(ValueError):
    """A source filter we cannot honour (``amqp:invalid-field``)."""


def format_offset(event_id: int) -> str:
    return f"{event_id:0{OFFSET_WIDTH}d}"


def parse_offset(text: str, *, head: int) -> int:
    """An offset (ours, or ``@earliest``/``@latest``) as the id to read after."""
    if text == EARLIEST:
        return 0
    if text == LATEST:
        return head
    if not text.isdigit() or len(text) > OFFSET_WIDTH:
        raise BadFilter(f"not an offset of this log: {quote_input(text, 40)}")
    return int(text)


# -- message -> event ---------------------------------------------------------------------------


class IncomingEvent(NamedTuple):
    """An event as a message brings it, before it is checked and stored."""

    type: str
    #: The data as JSON (opaque bytes as ``{"$binary": ...}``).
    data: Any
    #: A ``data`` section's content type (``""`` for none); None for an ``amqp-value``.
    content_type: str | None = None
    #: A JSON ``data`` section's text as sent, to be stored as it is (one line, UTF-8).
    text: str | None = None
    #: The producer's key (:data:`KEY_PROPERTY`), not checked yet.
    key: Any = None
    #: Its partition key and properties (see the module), not checked yet.
    attrs: EventAttrs | None = None

    def draft(self) -> EventDraft:
        """The event for :meth:`~futoin_evt.log.eventlog.EventLog.append`, which checks it."""
        return EventDraft(self.type, self.data, self.content_type, self.text, self.attrs)


def data_section_event(event_type: str, raw: bytes | bytearray, content_type: str) -> IncomingEvent:
    """The event of a ``data`` section (the rule of :mod:`~futoin_evt.domain.payload`).
    Raises :class:`BadMessage` for a content type too long to keep, and ValueError for JSON
    that is not JSON (its reason)."""
    if len(content_type) > MAX_CONTENT_TYPE_CHARS:
        raise BadMessage(
            "amqp:invalid-field", f"the content-type exceeds {MAX_CONTENT_TYPE_CHARS} characters"
        )
    try:
        draft = payload_draft(event_type, bytes(raw), content_type)
    except PayloadNotJson as exc:
        raise ValueError(exc.reason) from None
    return IncomingEvent(draft.type, draft.data, content_type, draft.text)


class MessageLike(Protocol):
    """What an event is read from: our :class:`~.engine.message.Message`, or a client
    library's message of the same attribute names."""

    @property
    def subject(self) -> Any: ...
    @property
    def body(self) -> Any: ...
    @property
    def inferred(self) -> Any: ...
    @property
    def content_type(self) -> Any: ...
    @property
    def properties(self) -> Any:
        """The application properties (a map, or None)."""

    @property
    def annotations(self) -> Any:
        """The message annotations (a map, or None)."""


def message_to_event(message: MessageLike) -> IncomingEvent:
    """The event of a received message; raises :class:`BadMessage`."""
    event_type = DEFAULT_EVENT_TYPE if message.subject is None else message.subject
    if not isinstance(event_type, str) or not event_type:
        raise BadMessage("amqp:invalid-field", "the message subject (the event type) is empty")
    body = message.body
    if message.inferred and isinstance(body, bytes | memoryview):
        try:
            event = data_section_event(event_type, bytes(body), _content_type(message))
        except ValueError as exc:
            if isinstance(exc, BadMessage):
                raise
            raise BadMessage("amqp:decode-error", f"the data section is not JSON: {exc}") from None
    elif message.inferred:
        raise BadMessage("amqp:invalid-field", "amqp-sequence bodies are not supported")
    else:
        event = IncomingEvent(event_type, to_json(body))
    properties = message.properties
    if not isinstance(properties, Mapping):
        properties = {}
    annotations = message.annotations
    key = partition_key(annotations) if isinstance(annotations, Mapping) else None
    attrs = incoming_attrs(key, properties)
    if attrs is not None or KEY_PROPERTY in properties:
        return event._replace(key=properties.get(KEY_PROPERTY), attrs=attrs)
    return event


def partition_key(annotations: Mapping[Any, Any]) -> str | None:
    """The partition key of a message's annotations (:data:`PARTITION_KEYS`); raises
    :class:`BadMessage` for one that is not a string."""
    for name in PARTITION_KEYS:
        key = annotations.get(name)
        if key is not None:
            if not isinstance(key, str):
                raise BadMessage("amqp:invalid-field", "a partition key must be a string")
            return str(key)
    return None


def incoming_attrs(key: str | None, properties: Mapping[Any, Any]) -> EventAttrs | None:
    """The attributes of a message: its partition key and its application properties but
    :data:`KEY_PROPERTY`, each value as the module says; None when it has neither. Raises
    :class:`BadMessage`."""
    kept = tuple(
        (_property_name(name), property_value(name, value))
        for name, value in properties.items()
        if name != KEY_PROPERTY
    )
    return None if key is None and not kept else EventAttrs(key, kept)


def _property_name(name: Any) -> str:
    if not isinstance(name, str):
        raise BadMessage("amqp:invalid-field", "application property names must be strings")
    return str(name)


def property_value(name: Any, value: Any) -> Any:
    """An application property's value as an event keeps it (see the module)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Timestamp):
        try:
            moment = datetime.fromtimestamp(int(value) / 1000, UTC)
        except (ValueError, OverflowError, OSError):
            raise BadMessage(
                "amqp:invalid-field",
                f"the application property {quote_input(name, 40)} is a timestamp out of range",
            ) from None
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(value, str):  # a symbol and a char too
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)  # a non-finite one is refused with the event's other attributes
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes | memoryview) and not isinstance(
        value, Decimal32 | Decimal64 | Decimal128
    ):
        return bytes(value)
    raise BadMessage(
        "amqp:invalid-field",
        f"the application property {quote_input(name, 40)} holds a {type(value).__name__};"
        " an event keeps text, numbers, booleans, null, binary, symbols, chars, uuids and"
        " timestamps",
    )


def _content_type(message: MessageLike) -> str:
    """The content type, ``""`` for none (some clients' getters give ``'None'`` then)."""
    content_type = message.content_type
    return "" if content_type is None or content_type == "None" else str(content_type)


def batch_messages(raw: bytes) -> list[Message]:
    """The messages of an Event Hubs batch: each ``data`` section of its body is one encoded
    message. Raises :class:`BadMessage`."""
    messages: list[Message] = []
    position = 0
    while position < len(raw):
        try:
            value, position = decode_value(raw, position)
        except DecodeError as exc:
            raise BadMessage("amqp:decode-error", f"undecodable batch section: {exc}") from None
        if not isinstance(value, Described) or value.descriptor != _DATA_SECTION:
            continue  # the batch's own header, properties and annotations
        if not isinstance(value.value, bytes):
            raise BadMessage("amqp:decode-error", "a data section that holds no binary")
        try:
            message = decode_message(value.value)
        except DecodeError as exc:
            raise BadMessage("amqp:decode-error", f"undecodable batched message: {exc}") from None
        messages.append(message)
    if not messages:
        raise BadMessage("amqp:decode-error", "a batch message with no messages in it")
    return messages


def to_json(value: Any, depth: int = 0) -> Any:
    """An AMQP value as JSON data; raises :class:`BadMessage` for what JSON cannot hold."""
    if depth > 64:
        raise BadMessage("amqp:invalid-field", "the body nests too deep")
    if value is None or isinstance(value, bool | str):
        return str(value) if isinstance(value, str) else value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise BadMessage("amqp:invalid-field", "the body holds a non-finite number")
        return float(value)
    if isinstance(value, Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, Mapping):
        result: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise BadMessage("amqp:invalid-field", "map keys in the body must be strings")
            result[str(key)] = to_json(item, depth + 1)
        return result
    if isinstance(value, list | tuple):
        return [to_json(item, depth + 1) for item in value]
    if isinstance(value, Array):
        return [to_json(item, depth + 1) for item in value.items]
    raise BadMessage(
        "amqp:invalid-field", f"the body holds a {type(value).__name__}, which JSON cannot hold"
    )


# -- event -> message ---------------------------------------------------------------------------


#: An encoded message kept, with what it was encoded from (data, ts, type, content type,
#: attributes).
_Kept = tuple[str, str, str, str | None, str | None, bytes]


class EventEncoder:
    """Events as encoded messages, one per delivery, without building a ``Message`` each time.

    The two annotation sections come from a template encoded once, whose fixed-width fields
    (the offsets, the sequence number, the timestamps) are packed in per event by one
    ``struct``; the properties section (the subject, the content type) is kept per event type
    and content type. Only the body is encoded per event:

    - an event that came as a ``data`` section goes out as the same section with the same
      content type (its stored JSON text, or its bytes);
    - other opaque bytes (``{"$binary": ...}``) as a ``data`` section;
    - other JSON data, on a link opened through an Event Hubs address, as its JSON text in a
      ``data`` section with ``content-type: application/json``; on a plain link as
      ``amqp-value``, unless AMQP cannot hold it (an integer beyond 64 bits): then as JSON
      text too.

    An event with attributes (see the module) has its annotations and application
    properties encoded for it. The recent events' messages are kept, so an event is encoded
    once for every consumer link that sends it.
    """

    _OFFSET = b"@" * OFFSET_WIDTH
    _EH_OFFSET = b"#" * OFFSET_WIDTH
    _TIMESTAMP = 0x1111_1111_1111_1111
    _SEQUENCE = 0x2222_2222_2222_2222
    _EH_TIMESTAMP = 0x3333_3333_3333_3333
    #: The holes of the template, in the order they are in it.
    _HOLES = ("offset", "timestamp", "offset", "sequence", "timestamp")

    def __init__(self) -> None:
        template = encode(
            Described(
                ULong(0x71),
                {
                    OFFSET_ANNOTATION: Symbol(self._OFFSET.decode()),
                    TIMESTAMP_ANNOTATION: Timestamp(self._TIMESTAMP),
                },
            )
        ) + encode(
            Described(
                ULong(0x72),
                {
                    EH_OFFSET: self._EH_OFFSET.decode(),
                    EH_SEQUENCE: self._SEQUENCE,
                    EH_ENQUEUED: Timestamp(self._EH_TIMESTAMP),
                },
            )
        )
        holes = sorted(
            (_find_once(template, marker), len(marker), kind)
            for marker, kind in (
                (self._OFFSET, "offset"),
                (self._EH_OFFSET, "offset"),
                (self._TIMESTAMP.to_bytes(8, "big"), "timestamp"),
                (self._EH_TIMESTAMP.to_bytes(8, "big"), "timestamp"),
                (self._SEQUENCE.to_bytes(8, "big"), "sequence"),
            )
        )
        if tuple(kind for _position, _size, kind in holes) != self._HOLES:
            raise AssertionError("the annotations template has its holes in another order")
        # The constant bytes between the holes are fields of the struct too (``Ns``).
        pieces: list[bytes] = []
        layout = ">"
        start = 0
        for position, size, kind in holes:
            pieces.append(template[start:position])
            layout += f"{position - start}s" + ("20s" if kind == "offset" else "q")
            start = position + size
        pieces.append(template[start:])
        layout += f"{len(template) - start}s"
        self._head = struct.Struct(layout)
        self._pieces = tuple(pieces)
        self._properties: dict[tuple[str, str | None], bytes] = {}
        #: Event id (negated for the Event Hubs form) -> (data, ts, type, content type,
        #: attributes, message): the recent events', in two generations (the older is dropped
        #: whole when the newer is full).
        self._recent: dict[int, _Kept] = {}
        self._older: dict[int, _Kept] = {}
        self._ms: dict[str, int] = {}

    def encode(self, event: StoredEvent, event_hubs: bool = False) -> bytes:
        """The message of ``event``; ``event_hubs``: for a link opened through an Event Hubs
        address (JSON as a ``data`` section)."""
        key = -event.id if event_hubs else event.id
        kept = self._recent.get(key) or self._older.get(key)
        # the same id in another log (servers share this encoder) is another event
        if (
            kept is not None
            and kept[0] == event.data_json
            and kept[1] == event.ts
            and kept[2] == event.type
            and kept[3] == event.content_type
            and kept[4] == event.attrs_json
        ):
            return kept[5]
        ms = self._ms.get(event.ts)
        if ms is None:
            if len(self._ms) >= _MAX_PROPERTIES_KEPT:
                self._ms.clear()
            ms = self._ms[event.ts] = event.timestamp_ms
        body, content_type = self._body(event, event_hubs)
        offset = b"%020d" % event.id
        p0, p1, p2, p3, p4, p5 = self._pieces
        properties = self._properties.get((event.type, content_type))
        if properties is None:
            properties = self._properties_of(event.type, content_type)
        if event.attrs_json is None:
            head = self._head.pack(p0, offset, p1, ms, p2, offset, p3, event.id, p4, ms, p5)
            message = b"".join((head, properties, body))
        else:
            message = _with_attrs(event, ms, properties, body)
        if len(self._recent) >= _RECENT_EVENTS:
            self._older = self._recent
            self._recent = {}
        self._recent[key] = (
            event.data_json,
            event.ts,
            event.type,
            event.content_type,
            event.attrs_json,
            message,
        )
        return message

    def _properties_of(self, event_type: str, content_type: str | None) -> bytes:
        key = (event_type, content_type)
        encoded = self._properties.get(key)
        if encoded is None:
            # message-id, user-id, to, subject, reply-to, correlation-id, content-type
            fields: list[Any] = [None, None, None, event_type]
            if content_type:
                fields += [None, None, Symbol(content_type)]
            try:
                encoded = encode(Described(ULong(0x73), fields))
            except EncodeError:  # a content type that is not ASCII: as a string
                fields[-1] = content_type
                encoded = encode(Described(ULong(0x73), fields))
            if len(self._properties) >= _MAX_PROPERTIES_KEPT:
                self._properties.clear()  # content types come from clients: stay bounded
            self._properties[key] = encoded
        return encoded

    @staticmethod
    def _body(event: StoredEvent, event_hubs: bool) -> tuple[bytes, str | None]:
        """The body section and the content type to send it with."""
        data_json = event.data_json
        came_as = event.content_type
        if came_as is not None and is_json_content_type(came_as):
            return _AMQP_DATA + _binary_bytes(data_json.encode()), came_as
        if came_as is not None or data_json.startswith(_BINARY_START):
            binary = _binary(json.loads(data_json))
            if binary is not None:
                return _AMQP_DATA + _binary_bytes(binary), came_as or None
        if event_hubs:
            return _AMQP_DATA + _binary_bytes(data_json.encode()), JSON_CONTENT_TYPE
        try:
            return _AMQP_VALUE + _json_value(decode_json(data_json.encode())), None
        except _TooBig:  # an integer beyond 64 bits
            return _AMQP_DATA + _binary_bytes(data_json.encode()), JSON_CONTENT_TYPE


def _with_attrs(event: StoredEvent, ms: int, properties: bytes, body: bytes) -> bytes:
    """The message of an event with attributes: the annotations of every message with its
    key among them, the properties, its application properties and the body."""
    attrs = parse_attrs(event.attrs_json)
    assert attrs is not None
    offset = format_offset(event.id)
    annotations: dict[Any, Any] = {
        EH_OFFSET: offset,
        EH_SEQUENCE: event.id,
        EH_ENQUEUED: Timestamp(ms),
    }
    if attrs.key is not None:
        annotations[PARTITION_KEYS[0]] = attrs.key
    application: dict[str, Any] = {}
    for name, value in attrs.properties:
        if not (attrs.verbatim and name in _CARRIED_HEADERS):
            application[name] = _outgoing_value(value)
    parts = [
        encode(
            Described(
                ULong(0x71),
                {OFFSET_ANNOTATION: Symbol(offset), TIMESTAMP_ANNOTATION: Timestamp(ms)},
            )
        ),
        encode(Described(ULong(0x72), annotations)),
        properties,
    ]
    if application:
        parts.append(encode(Described(ULong(0x74), application)))
    parts.append(body)
    return b"".join(parts)


def _outgoing_value(value: Any) -> Any:
    """A stored property's value as AMQP encodes it: an integer beyond a long as a ulong,
    beyond that as its text."""
    if type(value) is int and not -(2**63) <= value < 2**63:
        return ULong(value) if 0 <= value < 2**64 else str(value)
    return value


#: How stored opaque bytes begin (the stored JSON is compact): other data is not parsed
#: to find out.
_BINARY_START: Final = '{"$binary":'
_MAX_PROPERTIES_KEPT: Final = 4096
#: Events whose message is kept for the next consumer link that sends them (twice as many
#: at most: two generations).
_RECENT_EVENTS: Final = 4096
_AMQP_VALUE: Final = b"\x00\x53\x77"
_AMQP_DATA: Final = b"\x00\x53\x75"
_LONG: Final = struct.Struct(">bq")
_DOUBLE: Final = struct.Struct(">bd")
_COMPOUND32: Final = struct.Struct(">BII")
#: str8 constructors with their length, by length.
_STR8: Final = tuple(bytes((0xA1, length)) for length in range(256))
#: smalllong encodings of the integers that fit one byte.
_SMALL_LONGS: Final = {number: bytes((0x55, number & 0xFF)) for number in range(-128, 128)}
#: Map keys seen, encoded (keys repeat from event to event).
_KEYS: dict[str, bytes] = {}
_MAX_KEYS_KEPT: Final = 4096


class _TooBig(Exception):
    """An integer beyond what an AMQP long holds."""


def _json_value(value: Any) -> bytes:
    """The AMQP encoding of JSON data (a str as string, an int as long, a float as double, a
    list as list, a dict as map, each in its narrowest form), faster than the general
    encoder. Strings and small integers in a map or list are written without a call."""
    kind = type(value)
    if kind is dict:
        keys = _KEYS
        parts: list[bytes] = []
        append = parts.append
        for key, item in value.items():
            encoded = keys.get(key)
            if encoded is None:
                encoded = _json_value(key)
                if len(keys) >= _MAX_KEYS_KEPT:
                    keys.clear()
                keys[key] = encoded
            append(encoded)
            if type(item) is str:
                raw: bytes = item.encode()
                append(_STR8[len(raw)] if len(raw) < 256 else _str32_head(raw))
                append(raw)
            else:
                append(_json_value(item))
        return _compound(0xC1, 0xD1, b"".join(parts), 2 * len(value))
    if kind is str:
        raw = value.encode()
        return (_STR8[len(raw)] if len(raw) < 256 else _str32_head(raw)) + raw
    if kind is int:
        small = _SMALL_LONGS.get(value)
        if small is not None:
            return small
        if not -(2**63) <= value < 2**63:
            raise _TooBig
        return _LONG.pack(-127, value)  # 0x81: long
    if kind is float:
        return _DOUBLE.pack(-126, value)  # 0x82: double
    if value is None:
        return b"\x40"
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    if not value:
        return b"\x45"  # list0
    return _compound(0xC0, 0xD0, b"".join([_json_value(item) for item in value]), len(value))


def _str32_head(raw: bytes) -> bytes:
    return b"\xb1" + len(raw).to_bytes(4, "big")


def _compound(code8: int, code32: int, items: bytes, count: int) -> bytes:
    """A list or map of ``count`` encoded items: list8/map8 when it fits, else 32-bit."""
    if len(items) < 255 and count < 256:
        return bytes((code8, len(items) + 1, count)) + items
    return _COMPOUND32.pack(code32, len(items) + 4, count) + items


def _binary_bytes(raw: bytes) -> bytes:
    if len(raw) < 256:
        return b"\xa0" + bytes((len(raw),)) + raw
    return b"\xb0" + len(raw).to_bytes(4, "big") + raw


def _find_once(template: bytes, marker: bytes) -> int:
    position = template.find(marker)
    if position < 0 or template.find(marker, position + 1) >= 0:
        raise AssertionError("each placeholder must be in the template once")
    return position


def _binary(data: Any) -> bytes | None:
    if isinstance(data, dict) and len(data) == 1 and isinstance(data.get(BINARY_KEY), str):
        try:
            return base64.b64decode(data[BINARY_KEY], validate=True)
        except (binascii.Error, ValueError):
            return None
    return None


# -- filters ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Position:
    """Where a consumer starts: after ``after_id`` and after ``after_ms``, plus a predicate."""

    after_id: int
    #: Only events added after this instant (ms since the epoch), when given.
    after_ms: int | None = None
    matches: Callable[[StoredEvent], bool] | None = None

    def both(self, other: Position) -> Position:
        """Events that both positions let through (several filters on one link)."""
        after_ms = self.after_ms
        if other.after_ms is not None:
            after_ms = other.after_ms if after_ms is None else max(after_ms, other.after_ms)
        first, second = self.matches, other.matches
        matches = first or second
        if first is not None and second is not None:
            matches = lambda event: first(event) and second(event)  # noqa: E731
        return Position(max(self.after_id, other.after_id), after_ms, matches)


def filter_kind(descriptor: object) -> tuple[int, str] | None:
    for kind in (DELIVERY_ANNOTATIONS_FILTER, SQL_FILTER, SELECTOR_FILTER):
        if descriptor == kind[0] or (isinstance(descriptor, str) and descriptor == kind[1]):
            return kind
    return None


def delivery_annotations_start(value: object, *, head: int) -> Position:
    """The ``event-streams-delivery-annotations`` filter: events whose offset and timestamp
    are both greater than the given ones."""
    if not isinstance(value, Mapping) or not value:
        raise BadFilter("the delivery-annotations filter must be a non-empty map")
    after_id = 0
    after_ms: int | None = None
    for key, item in value.items():
        if key == OFFSET_ANNOTATION:
            if not isinstance(item, str):
                raise BadFilter("event-streams-offset must be a symbol or string")
            after_id = parse_offset(str(item), head=head)
        elif key == TIMESTAMP_ANNOTATION:
            if not isinstance(item, int) or isinstance(item, bool):
                raise BadFilter("event-streams-timestamp must be a timestamp")
            after_ms = int(item)
        else:
            raise BadFilter(f"cannot filter on {quote_input(key, 60)}")
    return Position(after_id, after_ms)


def described_filter(value: object) -> tuple[object, object]:
    """(descriptor, value) of one filter-set entry."""
    if isinstance(value, Described):
        descriptor = value.descriptor
        return (int(descriptor) if isinstance(descriptor, int) else descriptor), value.value
    raise BadFilter("filter entries must be described values")
