"""An event's attributes: a partition key and ordered properties, stored with the event. No I/O.

They are what the doors that have them carry beside the data: the Kafka door's record key
and headers, the AMQP door's partition key (the message annotation ``x-opt-partition-key``)
and application properties. An event stores them as one nullable text column, ``attrs``:
compact JSON, NULL for an event with neither key nor properties (the common event, which
pays nothing for them)::

    {"k": <key>, "p": [[<name>, <value>], ...], "v": 1}

``k`` is left out when there is no key, ``p`` when there are no properties, ``v`` unless the
properties are verbatim Kafka headers (:attr:`EventAttrs.verbatim`). A key or a value that
is bytes is ``{"$binary": "<base64>"}``, as opaque bytes are everywhere in the stored data;
every other value is a JSON string, number, boolean or null. Only bytes become a JSON object,
so a string that reads like ``{"$binary": ...}`` stays a JSON string and comes back a string:
the round trip is exact for every value type.

Limits (:class:`~.stream.EventRejected` with one sentence each): a key of at most
:data:`MAX_KEY_BYTES` (UTF-8 for a string), at most :data:`MAX_PROPERTIES` properties, names
of 1 to :data:`MAX_NAME_CHARS` characters, finite numbers. The stored JSON counts toward the
event's size with its data (:func:`~.stream.stored_form`): every door's message of the event
stays as large as an event with that much data alone.
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any, Final, NamedTuple

from ..ftn3.messages import decode_json, encode_json
from ..quoting import quote_input
from .rejections import EventRejected

#: The longest key, in bytes (UTF-8 for a string key).
MAX_KEY_BYTES: Final = 32 * 1024
#: The most properties an event carries.
MAX_PROPERTIES: Final = 256
#: The longest property name, in characters (the shortest is one).
MAX_NAME_CHARS: Final = 256
_BINARY: Final = "$binary"


class EventAttrs(NamedTuple):
    """A partition key and properties of an event (see the module)."""

    key: str | bytes | None
    #: (name, value) in order; a name may repeat (Kafka's headers allow it). A value is a
    #: str, int, float, bool, None or bytes.
    properties: tuple[tuple[str, Any], ...] = ()
    #: The properties are a Kafka record's headers exactly as its producer sent them: the
    #: Kafka door gives them back unchanged, adding none of its own.
    verbatim: bool = False


def attrs_json(attrs: EventAttrs) -> str | None:
    """The stored form of ``attrs``, its limits checked; None when it has neither key nor
    properties and is not verbatim (a Kafka record without headers is: it comes back without
    any). Raises :class:`~.stream.EventRejected`."""
    key, properties, verbatim = attrs
    if key is None and not properties:
        return _VERBATIM_ONLY if verbatim else None
    stored: dict[str, Any] = {}
    if key is not None:
        stored["k"] = _key_value(key)
    if properties:
        if len(properties) > MAX_PROPERTIES:
            raise EventRejected(
                f"an event has at most {MAX_PROPERTIES} properties, not {len(properties)}"
            )
        stored["p"] = [[_name(name), _value(name, value)] for name, value in properties]
    if verbatim:
        stored["v"] = 1
    return encode_json(stored)


#: The stored form of a Kafka record without key and headers (most records), and its value.
_VERBATIM_ONLY: Final = '{"v":1}'
_BARE_RECORD: Final = EventAttrs(None, (), verbatim=True)


def parse_attrs(text: str | None) -> EventAttrs | None:
    """The attributes of a stored event (its ``attrs`` column; None for NULL). Raises
    ValueError for text that :func:`attrs_json` never writes."""
    if text is None:
        return None
    if text == _VERBATIM_ONLY:
        return _BARE_RECORD
    stored = decode_json(text)
    if not isinstance(stored, dict):
        raise ValueError("stored attrs are not a JSON object")
    key = stored.get("k")
    if key is not None:
        key = _from_stored(key)
        if not isinstance(key, str | bytes):
            raise ValueError("a stored key is neither text nor bytes")
    properties = tuple((str(name), _from_stored(value)) for name, value in stored.get("p", ()))
    return EventAttrs(key, properties, stored.get("v") == 1)


def _key_value(key: Any) -> Any:
    if isinstance(key, bytes):
        size = len(key)
        stored: Any = _binary(key)
    elif isinstance(key, str):
        size = len(key) if key.isascii() else len(key.encode("utf-8", "surrogatepass"))
        stored = str(key)
    else:
        raise EventRejected(f"an event's key is text or bytes, not {type(key).__name__}")
    if size > MAX_KEY_BYTES:
        raise EventRejected(f"an event's key exceeds {MAX_KEY_BYTES} bytes")
    return stored


def _name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME_CHARS:
        raise EventRejected(
            f"invalid property name {quote_input(name, 40)}:"
            f" a property name is 1 to {MAX_NAME_CHARS} characters"
        )
    return str(name)


def _value(name: str, value: Any) -> Any:
    """A property's value as stored: the JSON value, bytes as ``{"$binary": ...}``."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EventRejected(f"the property {quote_input(name, 40)} is not a finite number")
        return float(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return _binary(bytes(value))
    raise EventRejected(
        f"the property {quote_input(name, 40)} holds a {type(value).__name__}: a property"
        " is text, a number, a boolean, null or bytes"
    )


def _binary(raw: bytes) -> dict[str, str]:
    return {_BINARY: base64.b64encode(raw).decode("ascii")}


def _from_stored(value: Any) -> Any:
    if isinstance(value, dict):
        encoded = value.get(_BINARY)
        if len(value) != 1 or not isinstance(encoded, str):
            raise ValueError("a stored value is an object that is not bytes")
        try:
            return base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise ValueError("stored bytes that are not base64") from None
    if isinstance(value, list):
        raise ValueError("a stored property value is a list")
    return value
