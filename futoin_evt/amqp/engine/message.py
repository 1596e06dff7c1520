"""AMQP messages (part 3.2): the sections of a message as one object, and back.

The attribute names are those of the common client libraries: ``properties`` are the
application properties, ``annotations`` the message annotations, ``instructions`` the
delivery annotations, ``address`` the ``to`` field, ``id`` the message id. A body of ``data``
sections (bytes) or ``amqp-sequence`` sections (a list) has ``inferred`` set; an
``amqp-value`` body has not.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from .types import (
    Buffer,
    DecodeError,
    Described,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    decode_value,
    encode_into,
)

HEADER: Final = 0x70
DELIVERY_ANNOTATIONS: Final = 0x71
MESSAGE_ANNOTATIONS: Final = 0x72
PROPERTIES: Final = 0x73
APPLICATION_PROPERTIES: Final = 0x74
DATA: Final = 0x75
SEQUENCE: Final = 0x76
VALUE: Final = 0x77
FOOTER: Final = 0x78
_PROPERTY_NAMES: Final = (
    "id", "user_id", "address", "subject", "reply_to", "correlation_id", "content_type",
    "content_encoding", "expiry_time", "creation_time", "group_id", "group_sequence",
    "reply_to_group_id",
)  # fmt: skip
_PROPERTY_TYPES: Final = (
    None,
    bytes,
    str,
    str,
    str,
    None,
    Symbol,
    Symbol,
    Timestamp,
    Timestamp,
    str,
    UInt,
    str,
)

#: What each properties field may hold (message ids: ulong, uuid, binary or string).
_PROPERTY_CHECKS: Final[tuple[type | tuple[type, ...], ...]] = (
    (int, uuid.UUID, bytes, str), bytes, str, str, str, (int, uuid.UUID, bytes, str), str, str,
    int, int, str, int, str,
)  # fmt: skip


@dataclass(slots=True)
class Message:
    body: Any = None
    inferred: bool = False
    # header
    durable: bool = False
    priority: int | None = None
    ttl: int | None = None
    first_acquirer: bool = False
    delivery_count: int = 0
    instructions: dict[Any, Any] | None = None
    annotations: dict[Any, Any] | None = None
    # properties
    id: Any = None
    user_id: bytes | None = None
    address: str | None = None
    subject: str | None = None
    reply_to: str | None = None
    correlation_id: Any = None
    content_type: str | None = None
    content_encoding: str | None = None
    expiry_time: int | None = None
    creation_time: int | None = None
    group_id: str | None = None
    group_sequence: int | None = None
    reply_to_group_id: str | None = None
    properties: dict[Any, Any] | None = None
    footer: dict[Any, Any] | None = field(default=None, repr=False)

    def encode(self) -> bytes:
        out = bytearray()
        if self.durable or self.priority is not None or self.ttl is not None:
            header = [
                self.durable,
                UByte(self.priority) if self.priority is not None else None,
                UInt(self.ttl) if self.ttl is not None else None,
                self.first_acquirer,
                UInt(self.delivery_count),
            ]
            _section(out, HEADER, header)
        if self.instructions:
            _section(out, DELIVERY_ANNOTATIONS, self.instructions)
        if self.annotations:
            _section(out, MESSAGE_ANNOTATIONS, self.annotations)
        fields = [
            value if value is None or kind is None else kind(value)
            for value, kind in zip(
                (getattr(self, name) for name in _PROPERTY_NAMES), _PROPERTY_TYPES, strict=True
            )
        ]
        if any(value is not None for value in fields):
            _section(out, PROPERTIES, fields)
        if self.properties is not None:
            _section(out, APPLICATION_PROPERTIES, self.properties)
        body = self.body
        if self.inferred and isinstance(body, bytes | bytearray | memoryview):
            _section(out, DATA, bytes(body))
        elif self.inferred and isinstance(body, list):
            _section(out, SEQUENCE, body)
        else:
            _section(out, VALUE, body)
        if self.footer:
            _section(out, FOOTER, self.footer)
        return bytes(out)


def _section(out: bytearray, code: int, value: Any) -> None:
    out += b"\x00\x53"
    out.append(code)
    encode_into(value, out)


def decode_message(raw: Buffer) -> Message:
    """The message of a delivery's bytes; raises :class:`DecodeError`."""
    message = Message()
    position = 0
    data: list[bytes] = []
    sequences: list[Any] = []
    has_value = False
    while position < len(raw):
        section, position = decode_value(raw, position)
        if not isinstance(section, Described) or not isinstance(section.descriptor, int):
            raise DecodeError("a message section that is not a described value")
        code, value = section.descriptor, section.value
        if code == HEADER:
            _header(message, value)
        elif code in (DELIVERY_ANNOTATIONS, MESSAGE_ANNOTATIONS, APPLICATION_PROPERTIES, FOOTER):
            if value is not None and not isinstance(value, dict):
                raise DecodeError(f"message section 0x{code:x} is not a map")
            name = {
                DELIVERY_ANNOTATIONS: "instructions",
                MESSAGE_ANNOTATIONS: "annotations",
                APPLICATION_PROPERTIES: "properties",
                FOOTER: "footer",
            }[code]
            setattr(message, name, value)
        elif code == PROPERTIES:
            _properties(message, value)
        elif code == DATA:
            if not isinstance(value, bytes):
                raise DecodeError("a data section that holds no binary")
            data.append(value)
        elif code == SEQUENCE:
            if not isinstance(value, list):
                raise DecodeError("an amqp-sequence section that holds no list")
            sequences.extend(value)
        elif code == VALUE:
            message.body = value
            has_value = True
        else:
            raise DecodeError(f"not a message section: 0x{code:x}")
    if sum((has_value, bool(data), bool(sequences))) > 1:
        raise DecodeError("a message with bodies of two kinds")
    if data:
        message.body = data[0] if len(data) == 1 else b"".join(data)
        message.inferred = True
    elif sequences:
        message.body = sequences
        message.inferred = True
    return message


def _header(message: Message, value: Any) -> None:
    if not isinstance(value, list):
        raise DecodeError("the header section is not a list")
    fields = [*value, None, None, None, None, None][:5]
    message.durable = bool(fields[0])
    message.priority = fields[1] if isinstance(fields[1], int) else None
    message.ttl = fields[2] if isinstance(fields[2], int) else None
    message.first_acquirer = bool(fields[3])
    message.delivery_count = fields[4] if isinstance(fields[4], int) else 0


def _properties(message: Message, value: Any) -> None:
    if not isinstance(value, list):
        raise DecodeError("the properties section is not a list")
    for name, kind, item in zip(_PROPERTY_NAMES, _PROPERTY_CHECKS, value, strict=False):
        if item is not None and not (isinstance(item, kind) and not isinstance(item, bool)):
            raise DecodeError(f"the {name} property has the wrong type")
        setattr(message, name, item)
