"""Opaque payloads as events and back: the rule for a message body that comes as bytes with a
content type (an AMQP ``data`` section, a Kafka record's value). No I/O.

A payload whose content type is JSON (``application/json``) is the event's data, its text kept
as sent when it is one line of UTF-8 (a line break would split the HTTP feed's NDJSON line);
so is one in Confluent's wire format that names a schema of the stream (see
:func:`schema_payload_draft`);
any other payload is kept as opaque bytes, ``{"$binary": "<base64>"}``, and goes back out byte
for byte. The content type is stored with the event (``""`` for none). A missing payload
(Kafka's null value) is the data ``null`` with the content type ``""``, which no payload that
was sent can be (bytes without a JSON content type are always opaque).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Final

from .attrs import EventAttrs
from .stream import EventDraft, EventRejected, OpaqueData

BINARY_KEY: Final = "$binary"
JSON_CONTENT_TYPE: Final = "application/json"
#: The longest content type a payload may carry (it is stored with the event).
MAX_CONTENT_TYPE_CHARS: Final = 256
#: How stored opaque bytes begin (the stored JSON is compact).
BINARY_START: Final = '{"$binary":'
#: Where their base64 text starts in that form.
_BINARY_TEXT_AT: Final = len('{"$binary":"')


def is_json_content_type(content_type: str) -> bool:
    return content_type.split(";")[0].strip().lower() == JSON_CONTENT_TYPE


def payload_draft(
    event_type: str, raw: bytes | None, content_type: str, attrs: EventAttrs | None = None
) -> EventDraft:
    """The event of a payload (with ``attrs``). Raises :class:`EventRejected` for a content
    type too long to keep, or a JSON content type on a payload that is not JSON."""
    if len(content_type) > MAX_CONTENT_TYPE_CHARS:
        raise EventRejected(f"the content type exceeds {MAX_CONTENT_TYPE_CHARS} characters")
    if raw is None:
        return EventDraft(event_type, None, "", None, attrs)
    if not content_type or not is_json_content_type(content_type):
        encoded = binascii.b2a_base64(raw, newline=False).decode("ascii")
        # the text as the data encodes (base64 needs no escape): stored without encoding again
        text = f'{{"{BINARY_KEY}":"{encoded}"}}'
        return EventDraft(event_type, OpaqueData({BINARY_KEY: encoded}), content_type, text, attrs)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return EventDraft(event_type, _parse_json(raw), content_type, None, attrs)  # UTF-16/32
    if text.startswith("\ufeff"):
        return EventDraft(event_type, _parse_json(text[1:]), content_type, None, attrs)
    kept = text if "\n" not in text and "\r" not in text else None
    return EventDraft(event_type, _parse_json(text), content_type, kept, attrs)


class PayloadNotJson(EventRejected):
    """A payload whose content type says JSON, and which is not; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"the payload is not the JSON its content type says: {reason}")
        self.reason = reason


def _parse_json(text: str | bytes) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise PayloadNotJson("it nests too deep") from None
    except ValueError as exc:
        raise PayloadNotJson(str(exc)) from None


#: Confluent's serializers' wire format: a zero byte and the schema id (4 bytes, big-endian)
#: before the JSON. Such a payload is stored as its JSON, with the id as a parameter of the
#: JSON content type, and goes back out with the same five bytes before it.
SCHEMA_ID_PARAMETER: Final = "schema-id"
_CONFLUENT_MAGIC: Final = 0


def confluent_schema_id(raw: bytes | None) -> int | None:
    """The schema id a payload in Confluent's wire format names; None for any other."""
    if raw is None or len(raw) < 5 or raw[0] != _CONFLUENT_MAGIC:
        return None
    return int.from_bytes(raw[1:5], "big")


def schema_payload_draft(event_type: str, raw: bytes, schema_id: int) -> EventDraft:
    """The event of a payload in Confluent's wire format whose schema is ``schema_id``: its
    JSON is the data (checked against the type's schema as any event's)."""
    content_type = f"{JSON_CONTENT_TYPE}; {SCHEMA_ID_PARAMETER}={schema_id}"
    return payload_draft(event_type, raw[5:], content_type)


def _schema_prefix(content_type: str) -> bytes:
    """The wire format's five bytes for a content type that names a schema id, else b""."""
    _type, _semicolon, parameters = content_type.partition(";")
    for parameter in parameters.split(";"):
        name, _equals, value = parameter.strip().partition("=")
        if name == SCHEMA_ID_PARAMETER and value.isdigit():
            return bytes((_CONFLUENT_MAGIC,)) + int(value).to_bytes(4, "big")
    return b""


def stored_payload(data_json: str, content_type: str | None) -> bytes | None:
    """An event's payload as its producer sent it (see the module): opaque bytes as they
    were, a JSON payload as its stored text, a missing one as None; an event that did not come
    as a payload (an FTN18 event, say) as its JSON text."""
    if content_type is not None:
        if not is_json_content_type(content_type):
            if data_json.startswith(BINARY_START):
                raw = opaque_bytes(data_json)
                if raw is not None:
                    return raw
            elif content_type == "" and data_json == "null":
                return None
        elif ";" in content_type:
            return _schema_prefix(content_type) + data_json.encode()
    return data_json.encode()


def opaque_bytes(data_json: str) -> bytes | None:
    """The bytes of stored opaque data (``{"$binary": ...}``), None for any other data."""
    if data_json.endswith('"}') and data_json.find('"', _BINARY_TEXT_AT) == len(data_json) - 2:
        try:  # the compact form stored: the base64 between its quotes
            return binascii.a2b_base64(data_json[_BINARY_TEXT_AT:-2], strict_mode=True)
        except binascii.Error:
            return None
    try:
        value = json.loads(data_json)
    except ValueError:
        return None
    if not isinstance(value, dict) or len(value) != 1:
        return None
    encoded = value.get(BINARY_KEY)
    if not isinstance(encoded, str):
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
