"""The quick path from message bytes to an event gives what proton's path gives, or steps
aside (no server)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from proton import (
    Message,
    byte,
    char,
    float32,
    int32,
    short,
    symbol,
    timestamp,
    ubyte,
    uint,
    ulong,
    ushort,
)

from futoin_evt.amqp.codec import KEY_PROPERTY, BadMessage, IncomingEvent, message_to_event
from futoin_evt.amqp.quickdecode import quick_event
from futoin_evt.domain.attrs import EventAttrs

ASCII = st.text(st.characters(max_codepoint=127))
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.integers(0, 2**64 - 1).map(ulong)
    | st.integers(0, 2**32 - 1).map(uint)
    | st.integers(0, 255).map(ubyte)
    | st.integers(0, 2**16 - 1).map(ushort)
    | st.integers(-128, 127).map(byte)
    | st.integers(-(2**15), 2**15 - 1).map(short)
    | st.integers(-(2**31), 2**31 - 1).map(int32)
    | st.floats(width=32).map(float32)
    | st.floats()
    | st.text()
    | ASCII.map(symbol)
    | st.binary(max_size=8)
    | st.integers(0, 2**40).map(timestamp)
    | st.characters().map(char)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.text() | st.integers(-(2**63), 2**63 - 1), inner, max_size=5)
        | st.dictionaries(ASCII.map(lambda k: symbol("s:" + k)), inner, max_size=3)
    ),
    max_leaves=20,
)
SUBJECTS = st.none() | st.text(max_size=20)
CONTENT_TYPES = st.none() | st.sampled_from(
    ["application/json", "text/plain", "application/json; v=1"]
)


def proton_path(raw: bytes) -> IncomingEvent | str:
    message = Message()
    message.decode(raw)
    try:
        return message_to_event(message)
    except BadMessage as exc:
        return exc.condition


@given(SUBJECTS, VALUES, st.none() | st.integers(0, 2**32), st.booleans(), SCALARS)
def test_amqp_value_bodies(
    subject: str | None, body: Any, message_id: Any, annotated: bool, key: Any
) -> None:
    message = Message(subject=subject, body=body, id=message_id)
    if annotated:  # the application properties are read for the producer's key
        message.annotations = {symbol("x-opt-partition-key"): "k"}
        message.properties = {"a": 1, KEY_PROPERTY: key}  # type: ignore[assignment]
    raw = message.encode()
    quick = quick_event(raw)
    if quick is not None:
        proton = proton_path(raw)
        assert quick == proton
        # int stays int, float stays float (a key that is not a string is refused anyway)
        assert repr(quick[:4]) == repr(proton[:4])


@given(SUBJECTS, st.binary(max_size=64) | st.just(b'{"a": [1, 2.5, "x"]}'), CONTENT_TYPES)
def test_data_sections(subject: str | None, data: bytes, content_type: str | None) -> None:
    message = Message(subject=subject, body=data, inferred=True, content_type=content_type)
    raw = message.encode()
    quick = quick_event(raw)
    if quick is not None:
        assert quick == proton_path(raw)


def test_typical_messages_take_the_quick_path() -> None:
    body = {"order": 17, "items": [{"sku": "A-1", "qty": 2, "price": 9.5}], "paid": True}
    typical = [
        Message(subject="ORDER_PLACED", body=body),
        Message(subject="ORDER_PLACED", body=body, id=42, durable=True),
        Message(subject="ORDER_PLACED", body=body, properties={KEY_PROPERTY: "p:1", "n": 7}),
        Message(body=b'{"n": 1}', inferred=True, content_type="application/json"),
        Message(body=b"\x00\x01", inferred=True),
    ]
    for message in typical:
        raw = message.encode()
        assert quick_event(raw) == proton_path(raw)
    keyed = quick_event(typical[2].encode())
    assert keyed is not None
    assert keyed.key == "p:1"


@given(
    st.dictionaries(st.text(max_size=8), VALUES, max_size=4),
    st.none() | st.text(max_size=8) | st.integers(0, 9),
    st.booleans(),
)
def test_partition_keys_and_application_properties(
    properties: dict[str, Any], key: Any, group_key: bool
) -> None:
    """The attributes the quick path reads are those proton's path reads."""
    message = Message(subject="T", body=1, properties=properties)
    if key is not None:
        name = "event-streams-group-key" if group_key else "x-opt-partition-key"
        message.annotations = {symbol("x-opt-before"): [1], symbol(name): key}
    raw = message.encode()
    quick = quick_event(raw)
    if quick is not None:
        proton = proton_path(raw)
        assert quick == proton
        assert repr(quick) == repr(proton)


def test_messages_with_attributes_take_the_quick_path() -> None:
    message = Message(subject="T", body={"n": 1}, properties={"tenant": "acme", "n": 7})
    message.annotations = {symbol("x-opt-partition-key"): "order-7"}
    raw = message.encode()
    quick = quick_event(raw)
    assert quick is not None
    assert quick == proton_path(raw)
    assert quick.attrs == EventAttrs("order-7", (("tenant", "acme"), ("n", 7)))


@given(st.binary(max_size=80))
def test_garbage_steps_aside_or_agrees(raw: bytes) -> None:
    quick = quick_event(raw)
    if quick is not None:
        assert quick == proton_path(raw)
