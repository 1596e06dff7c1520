"""Kafka records as events and events as records: one log, the same event at every door.
No I/O.

A record's key is the event's partition key and its headers the event's properties, kept as
they were sent (names in order, repeats and null values too), so the record comes back as
its producer sent it. The event type is the ``ce_type`` header (CloudEvents' Kafka binding),
else ``EVENT`` as at the AMQP door; the ``content-type`` header is the content type; the
value follows :mod:`~futoin_evt.domain.payload` (JSON with a JSON content type is the event's
data, anything else is opaque bytes). A ``futoin-evt-key`` header is the producer's key of the
other doors: within the dedup window, a record whose key is stored stores nothing.

An event added through another door goes out as a record at offset = its id, with the
headers ``ce_type`` (its type), ``content-type`` (``application/json`` for JSON data, or the
type it came with) and its properties. Keys and header values are text when they are UTF-8,
else bytes; either goes out as the same bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Final

from ..domain.attrs import EventAttrs, parse_attrs
from ..domain.payload import (
    JSON_CONTENT_TYPE,
    confluent_schema_id,
    payload_draft,
    schema_payload_draft,
    stored_payload,
)
from ..domain.stream import EventDraft, EventRejected, StoredEvent
from .records import Record

TYPE_HEADER: Final = "ce_type"
CONTENT_TYPE_HEADER: Final = "content-type"
KEY_HEADER: Final = "futoin-evt-key"
DEFAULT_EVENT_TYPE: Final = "EVENT"

Header = tuple[str, bytes | None]
#: What a Fetch encodes of one event: (offset delta, key, value, headers).
OutRecord = tuple[int, bytes | None, bytes | None, list[Header]]


def _text_or_bytes(raw: bytes) -> str | bytes:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


#: The event type of a stream whose newest schema has an id (None: no type has it).
SchemaTypes = Callable[[int], str | None]


def record_event(
    record: Record, schema_types: SchemaTypes | None = None
) -> tuple[EventDraft, str | None]:
    """The event of a produced record, and its producer's key (None for none); raises
    :class:`~futoin_evt.domain.stream.EventRejected` (the batch is refused). A value in
    Confluent's wire format whose schema id is the newest schema of one of the stream's
    types (``schema_types``) is an event of that type (unless a ``ce_type`` header says
    another), its JSON the data."""
    event_type = DEFAULT_EVENT_TYPE
    typed = False
    content_type = ""
    dedup_key: str | None = None
    for name, value in record.headers:
        if value is None:
            continue
        if name == TYPE_HEADER:
            event_type = _header_text(name, value)
            typed = True
        elif name == CONTENT_TYPE_HEADER:
            content_type = _header_text(name, value)
        elif name == KEY_HEADER:
            dedup_key = _header_text(name, value)
    draft = None
    if schema_types is not None and record.value is not None and not content_type:
        schema_id = confluent_schema_id(record.value)
        schema_type = None if schema_id is None else schema_types(schema_id)
        if schema_id is not None and schema_type is not None:
            chosen = event_type if typed else schema_type
            draft = schema_payload_draft(chosen, record.value, schema_id)
    key = None if record.key is None else _text_or_bytes(record.key)
    # always: a record without key or headers comes back without them too
    attrs = _BARE if key is None and not record.headers else _attrs(key, record.headers)
    if draft is None:
        return payload_draft(event_type, record.value, content_type, attrs), dedup_key
    return draft._replace(attrs=attrs), dedup_key


_BARE: Final = EventAttrs(None, (), verbatim=True)


def _attrs(key: str | bytes | None, headers: Sequence[Header]) -> EventAttrs:
    properties = tuple(
        (name, None if value is None else _text_or_bytes(value)) for name, value in headers
    )
    return EventAttrs(key, properties, verbatim=True)


def _header_text(name: str, value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise EventRejected(f"the {name} header is not UTF-8 text") from None


def _out_bytes(value: Any) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


def event_record(event: StoredEvent, base_id: int) -> OutRecord:
    """The record of a stored event, at offset delta ``event.id - base_id``."""
    attrs = parse_attrs(event.attrs_json)
    value = stored_payload(event.data_json, event.content_type)
    if attrs is not None and attrs.verbatim:
        headers = [(name, _out_bytes(item)) for name, item in attrs.properties]
    else:
        content_type = event.content_type
        headers = [(TYPE_HEADER, event.type.encode())]
        if content_type is None:
            headers.append((CONTENT_TYPE_HEADER, _JSON_BYTES))
        elif content_type:
            headers.append((CONTENT_TYPE_HEADER, content_type.encode()))
        if attrs is not None:
            headers.extend((name, _out_bytes(item)) for name, item in attrs.properties)
    key = _out_bytes(attrs.key) if attrs is not None else None
    return event.id - base_id, key, value, headers


_JSON_BYTES: Final = JSON_CONTENT_TYPE.encode()


def event_records(events: Sequence[StoredEvent]) -> list[tuple[int, int, list[OutRecord]]]:
    """The events as batches to encode: (base offset, timestamp in ms, records), one batch
    per run of events stored in the same second (a batch's records share its log-append
    time)."""
    batches: list[tuple[int, int, list[OutRecord]]] = []
    last_ts = ""
    records: list[OutRecord] = []
    base = 0
    for event in events:
        if event.ts != last_ts or not records:
            records = []
            base = event.id
            last_ts = event.ts
            batches.append((base, event.timestamp_ms, records))
        records.append(event_record(event, base))
    return batches
