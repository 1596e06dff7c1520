"""Received message bytes to events in one pass, for the common messages.

Producers send messages whose sections hold plain values: perhaps message annotations (a
partition key among them), a ``properties`` section with a subject and perhaps a content
type, perhaps application properties (the producer's key of the event among them), and an
``amqp-value`` body of strings, numbers, booleans, nulls, lists and maps with string keys, or
one ``data`` section. Decoding them into a :class:`~.engine.message.Message` builds an
object for every section and value, which is most of a producer's cost. :func:`quick_event`
reads such a message directly; for anything else (other value types, sequences, several data
sections, a described descriptor of another form, a malformed message) it returns None, and
the caller takes the general decoder's path, which also words every error.
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final

from .codec import (
    DEFAULT_EVENT_TYPE,
    KEY_PROPERTY,
    PARTITION_KEYS,
    BadMessage,
    IncomingEvent,
    data_section_event,
    incoming_attrs,
)

_MESSAGE_ANNOTATIONS: Final = 0x72
_PROPERTIES: Final = 0x73
_DATA: Final = 0x75
_VALUE: Final = 0x77
_APPLICATION_PROPERTIES: Final = 0x74
#: Sections skipped unread: header, delivery annotations, footer.
_SKIPPED: Final = frozenset((0x70, 0x71, 0x78))
_MAX_DEPTH: Final = 64
#: Width of the length (or size) field by the high nibble of a constructor, for skipping.
_VARIABLE_WIDTH: Final = {0xA: 1, 0xB: 4, 0xC: 1, 0xD: 4, 0xE: 1, 0xF: 4}
_FIXED_WIDTH: Final = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}
_FLOAT: Final = struct.Struct(">f")
_DOUBLE: Final = struct.Struct(">d")
_SIGNED: Final = frozenset((0x51, 0x54, 0x55, 0x61, 0x71, 0x81))
#: Integer constructors and their widths (signed: byte, smallint, smalllong, short, int,
#: long; unsigned: ubyte, smalluint, smallulong, ushort, uint, ulong).
_INT_WIDTHS: Final = {
    0x51: 1, 0x54: 1, 0x55: 1, 0x61: 2, 0x71: 4, 0x81: 8,
    0x50: 1, 0x52: 1, 0x53: 1, 0x60: 2, 0x70: 4, 0x80: 8,
}  # fmt: skip
#: Constructors whose value is the constructor itself: null, true, false, uint0, ulong0.
_CONSTANTS: Final[dict[int, Any]] = {0x40: None, 0x41: True, 0x42: False, 0x43: 0, 0x44: 0}
_TEXT, _INT, _CONSTANT, _COMPOUND_LIST, _COMPOUND_MAP, _REAL, _OTHER = range(7)
_KINDS: Final = {
    **dict.fromkeys((0xA1, 0xA3, 0xB1, 0xB3), _TEXT),  # string, symbol
    **dict.fromkeys(_INT_WIDTHS, _INT),
    **dict.fromkeys(_CONSTANTS, _CONSTANT),
    **dict.fromkeys((0x45, 0xC0, 0xD0), _COMPOUND_LIST),
    **dict.fromkeys((0xC1, 0xD1), _COMPOUND_MAP),
    **dict.fromkeys((0x72, 0x82), _REAL),  # float, double
}


class _Unusual(Exception):
    """Not a message this path reads: the general decoder takes it."""


def quick_event(raw: bytes) -> IncomingEvent | None:
    """The event :func:`~.codec.message_to_event` would give, or None."""
    try:
        return _event(raw)
    except (_Unusual, IndexError, UnicodeDecodeError, struct.error):
        return None


def _event(raw: bytes) -> IncomingEvent:
    subject: Any = None
    content_type: Any = None
    body: Any = None
    data: bytes | None = None
    key: Any = None
    properties: dict[str, Any] = {}
    partition_key: Any = None
    has_value = False
    position = 0
    while position < len(raw):
        if raw[position] != 0 or raw[position + 1] != 0x53:
            raise _Unusual
        section = raw[position + 2]
        position += 3
        if section in _SKIPPED:
            position = _skip(raw, position)
        elif section == _MESSAGE_ANNOTATIONS:
            partition_key, position = _partition_key(raw, position)
        elif section == _PROPERTIES:
            subject, content_type, position = _properties(raw, position)
        elif section == _APPLICATION_PROPERTIES:
            properties, position = _map(raw, position, 0)
            key = properties.get(KEY_PROPERTY)
        elif section == _VALUE and not has_value and data is None:
            body, position = _value(raw, position, 0)
            has_value = True
        elif section == _DATA and not has_value and data is None:
            code = raw[position]
            if code not in (0xA0, 0xB0):
                raise _Unusual
            width = 1 if code == 0xA0 else 4
            length = int.from_bytes(raw[position + 1 : position + 1 + width], "big")
            start = position + 1 + width
            data = raw[start : start + length]
            if len(data) != length:
                raise _Unusual
            position = start + length
        else:
            raise _Unusual
    if position != len(raw) or not (has_value or data is not None):
        raise _Unusual
    event_type = DEFAULT_EVENT_TYPE if subject is None else subject
    if not isinstance(event_type, str) or not event_type:
        raise _Unusual
    attrs = None
    if partition_key is not None or len(properties) > (KEY_PROPERTY in properties):
        if any(isinstance(value, list | dict) for value in properties.values()):
            raise _Unusual  # refused: proton's path words it
        try:
            attrs = incoming_attrs(partition_key, properties)
        except BadMessage:
            raise _Unusual from None
    if data is None:
        return IncomingEvent(event_type, body, key=key, attrs=attrs)
    if content_type is not None and not isinstance(content_type, str):
        raise _Unusual
    try:
        event = data_section_event(event_type, data, content_type or "")
    except ValueError:  # BadMessage too
        raise _Unusual from None  # proton's path words the refusal
    return event if key is None and attrs is None else event._replace(key=key, attrs=attrs)


def _partition_key(raw: bytes, position: int) -> tuple[str | None, int]:
    """The partition key of the message annotations (the first of
    :data:`~.codec.PARTITION_KEYS`), and their end; the other annotations are skipped."""
    if raw[position] not in (0xC1, 0xD1):  # map8, map32
        raise _Unusual
    count, position, end = _compound(raw, position, 0)
    if count % 2:
        raise _Unusual
    found: dict[str, Any] = {}
    for _ in range(count // 2):
        if raw[position] not in (0xA3, 0xB3):
            raise _Unusual  # an annotation's key is a symbol (or a ulong, reserved)
        name, position = _value(raw, position, 0)
        if name in PARTITION_KEYS:
            found[name], position = _value(raw, position, 0)
        else:
            position = _skip(raw, position)
    if position != end:
        raise _Unusual
    key = next((found[name] for name in PARTITION_KEYS if found.get(name) is not None), None)
    if key is not None and not isinstance(key, str):
        raise _Unusual  # refused: proton's path words it
    return key, end


def _properties(raw: bytes, position: int) -> tuple[Any, Any, int]:
    """(subject, content-type, end) of the properties list; the other fields are skipped."""
    count, position, end = _compound(raw, position, 0)
    subject = content_type = None
    for index in range(count):
        if raw[position] == 0x40:  # null: most fields are
            position += 1
        elif index in (3, 6):
            value, position = _value(raw, position, 0)
            if index == 3:
                subject = value
            else:
                content_type = value
        else:
            position = _skip(raw, position)
    if position != end:
        raise _Unusual
    return subject, content_type, end


def _value(raw: bytes, position: int, depth: int) -> tuple[Any, int]:
    """One value as JSON data, and where the next begins."""
    code = raw[position]
    if code == 0xA1 or code == 0xA3:  # str8, sym8: the most common, read first
        start = position + 2
        end = start + raw[position + 1]
        if end > len(raw):
            raise _Unusual
        return raw[start:end].decode("utf-8"), end
    if code == 0x52 or code == 0x50 or code == 0x53:  # smalluint, ubyte, smallulong
        return raw[position + 1], position + 2
    kind = _KINDS.get(code, _OTHER)
    position += 1
    if kind == _TEXT:
        width = 1 if code < 0xB0 else 4
        start = position + width
        end = _within(raw, start + int.from_bytes(raw[position:start], "big"))
        return raw[start:end].decode("utf-8"), end
    if kind == _INT:
        end = _within(raw, position + _INT_WIDTHS[code])
        return int.from_bytes(raw[position:end], "big", signed=code in _SIGNED), end
    if kind == _CONSTANT:
        return _CONSTANTS[code], position
    if kind == _COMPOUND_LIST:
        return _list(raw, position - 1, depth)
    if kind == _COMPOUND_MAP:
        return _map(raw, position - 1, depth)
    if kind == _REAL:
        number = (_FLOAT if code == 0x72 else _DOUBLE).unpack_from(raw, position)[0]
        if not math.isfinite(number):
            raise _Unusual
        return float(number), position + (4 if code == 0x72 else 8)
    if code == 0x56 and raw[position] <= 1:  # boolean in a byte
        return raw[position] == 1, position + 1
    raise _Unusual


def _within(raw: bytes, end: int) -> int:
    if end > len(raw):
        raise _Unusual
    return end


def _compound(raw: bytes, position: int, depth: int) -> tuple[int, int, int]:
    """(count, first item, end) of the list or map whose constructor is at ``position``."""
    if depth >= _MAX_DEPTH:
        raise _Unusual
    code = raw[position]
    if code == 0x45:
        return 0, position + 1, position + 1
    width = 1 if code in (0xC0, 0xC1) else 4
    size = int.from_bytes(raw[position + 1 : position + 1 + width], "big")
    count = int.from_bytes(raw[position + 1 + width : position + 1 + 2 * width], "big")
    end = _within(raw, position + 1 + width + size)
    return count, position + 1 + 2 * width, end


def _list(raw: bytes, position: int, depth: int) -> tuple[list[Any], int]:
    count, position, end = _compound(raw, position, depth)
    items = []
    for _ in range(count):
        item, position = _value(raw, position, depth + 1)
        items.append(item)
    if position != end:
        raise _Unusual
    return items, end


def _map(raw: bytes, position: int, depth: int) -> tuple[dict[str, Any], int]:
    count, position, end = _compound(raw, position, depth)
    if count % 2:
        raise _Unusual
    result: dict[str, Any] = {}
    for _ in range(count // 2):
        if raw[position] not in (0xA1, 0xA3, 0xB1, 0xB3):
            raise _Unusual  # proton's path refuses keys that are not strings
        key, position = _value(raw, position, depth + 1)
        result[key], position = _value(raw, position, depth + 1)
    if position != end:
        raise _Unusual
    return result, end


def _skip(raw: bytes, position: int) -> int:
    """Where the value at ``position`` (a section's, of any type) ends."""
    code = raw[position]
    if code == 0:  # described: descriptor, then value
        return _skip(raw, _skip(raw, position + 1))
    nibble = code >> 4
    if nibble in _FIXED_WIDTH:
        return _within(raw, position + 1 + _FIXED_WIDTH[nibble])
    width = _VARIABLE_WIDTH.get(nibble)
    if width is None:
        raise _Unusual
    length = int.from_bytes(raw[position + 1 : position + 1 + width], "big")
    return _within(raw, position + 1 + width + length)
