"""Events to AMQP messages and back, without sockets: what a consumer decodes is the event."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Data, Described, Message, char, symbol, timestamp, ulong

from futoin_evt.amqp.codec import (
    DEFAULT_EVENT_TYPE,
    KEY_PROPERTY,
    BadMessage,
    EventEncoder,
    Position,
    format_offset,
    message_to_event,
)
from futoin_evt.amqp.engine.message import decode_message
from futoin_evt.domain.attrs import EventAttrs, attrs_json, parse_attrs
from futoin_evt.domain.stream import EventId, StoredEvent, stored_form, ts_to_ms

TS = "2026-11-23T08:00:05Z"
UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")


def decoded(
    event_id: int,
    data_json: str,
    event_type: str = "ORDER",
    content_type: str | None = None,
    event_hubs: bool = False,
) -> Message:
    event = StoredEvent(EventId(event_id), event_type, data_json, TS, content_type)
    message = Message()
    message.decode(EventEncoder().encode(event, event_hubs))
    return message


@pytest.mark.parametrize("event_id", [1, 255, 65_536, 2**31, 2**40, 2**63 - 1])
def test_annotations_of_every_delivery(event_id: int) -> None:
    message = decoded(event_id, '{"a":1}')
    assert message.subject == "ORDER"
    assert message.body == {"a": 1}
    assert message.instructions == {
        symbol("event-streams-offset"): format_offset(event_id),
        symbol("event-streams-timestamp"): ts_to_ms(TS),
    }
    assert message.annotations == {
        symbol("x-opt-offset"): format_offset(event_id),
        symbol("x-opt-sequence-number"): event_id,
        symbol("x-opt-enqueued-time"): ts_to_ms(TS),
    }


@pytest.mark.parametrize(
    "data",
    [None, True, 0, -5, 2**63 - 1, 1.5, "", "ünïcode ✓", [], [1, [2, None]], {}, {"a": {"b": "c"}}],
)
def test_json_data_is_the_amqp_value_body(data: Any) -> None:
    message = decoded(7, json.dumps(data))
    assert not message.inferred
    assert message.body == data


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=30,
)


@given(JSON_VALUES)
def test_bodies_are_encoded_as_proton_encodes_them(data: Any) -> None:
    """The body encoder of our own gives what proton's encoder gives, type for type."""
    ours = decoded(7, json.dumps(data))
    reference = Data()
    reference.put_object(Described(ulong(0x77), data))
    expected = Data()
    expected.decode(reference.encode())
    expected.rewind()
    expected.next()
    value = expected.get_object()
    assert isinstance(value, Described)
    assert repr(ours.body) == repr(value.value)


def test_data_proton_cannot_hold_goes_as_json_text() -> None:
    message = decoded(7, '{"big":123456789012345678901234567890}')
    assert message.inferred
    assert message.content_type == "application/json"
    assert message.body == b'{"big":123456789012345678901234567890}'


def test_opaque_bytes_go_back_as_they_came() -> None:
    for content_type in (None, "image/png"):
        sent = Message(subject="BLOB", body=b"\x00\xff\x10", inferred=True)
        if content_type is not None:
            sent.content_type = content_type
        _type, data_json, kept, _attrs = stored_form(message_to_event(sent).draft())
        assert json.loads(data_json) == {"$binary": "AP8Q"}  # what FTN3 and the feed show
        for event_hubs in (False, True):
            message = decoded(7, data_json, "BLOB", kept, event_hubs)
            assert message.inferred
            assert message.body == b"\x00\xff\x10"
            assert message.subject == "BLOB"
            assert message.content_type == (content_type or "None")  # proton's "none"


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
def test_a_json_data_section_goes_back_as_it_came(content_type: str) -> None:
    text = '{"k": 0, "s": "caf\u00e9 \\u00e9", "f": 1E2}'
    sent = Message(body=text.encode(), inferred=True, content_type=content_type)
    event = message_to_event(sent)
    assert event.data == {"k": 0, "s": "café é", "f": 100.0}
    event_type, data_json, kept, attrs = stored_form(event.draft())
    assert (event_type, data_json, kept, attrs) == ("EVENT", text, content_type, None)
    for event_hubs in (False, True):
        message = decoded(7, data_json, event_type, kept, event_hubs)
        assert (message.inferred, message.body, message.content_type) == (
            True,
            text.encode(),
            content_type,
        )


def test_json_text_with_line_breaks_is_stored_compact() -> None:
    """The HTTP feed serves one event per line: such text keeps its data, not its layout."""
    sent = Message(body=b'{\n  "k": [1,\r\n 2]\n}', inferred=True, content_type="application/json")
    assert stored_form(message_to_event(sent).draft())[1:] == (
        '{"k":[1,2]}',
        "application/json",
        None,
    )


def test_json_of_other_doors_is_a_data_section_on_event_hubs_links_only() -> None:
    plain = decoded(7, '{"k":0}')
    assert (plain.inferred, plain.body) == (False, {"k": 0})
    assert plain.content_type == "None"  # proton's getter when there is none
    hub = decoded(7, '{"k":0}', event_hubs=True)
    assert (hub.inferred, hub.body, hub.content_type) == (True, b'{"k":0}', "application/json")


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            Message(subject="T", body={"a": [1, 2.5, None, True]}),
            ("T", {"a": [1, 2.5, None, True]}),
        ),
        (Message(subject="T", body=ulong(5)), ("T", 5)),
        (Message(body={"n": 1}), (DEFAULT_EVENT_TYPE, {"n": 1})),  # Event Hubs clients
        (Message(subject="T", body=symbol("s")), ("T", "s")),
        (
            Message(subject="T", body=b'{"x": 1}', inferred=True, content_type="application/json"),
            ("T", {"x": 1}),
        ),
        (
            Message(subject="T", body=b"[1]", inferred=True, content_type="application/json; v=1"),
            ("T", [1]),
        ),
    ],
)
def test_messages_to_events(message: Message, expected: tuple[str, Any]) -> None:
    assert message_to_event(message)[:2] == expected


@pytest.mark.parametrize(
    ("message", "condition"),
    [
        (Message(subject="", body=1), "amqp:invalid-field"),
        (Message(subject="T", body=float("nan")), "amqp:invalid-field"),
        (Message(subject="T", body={1: 2}), "amqp:invalid-field"),
        (Message(subject="T", body=[b"bytes"]), "amqp:invalid-field"),
        (Message(subject="T", body=[[1]], inferred=True), "amqp:invalid-field"),
        (
            Message(subject="T", body=b"{", inferred=True, content_type="application/json"),
            "amqp:decode-error",
        ),
        (
            Message(body=b"[" * 100_000, inferred=True, content_type="application/json"),
            "amqp:decode-error",
        ),
        (Message(body=b"", inferred=True, content_type="x/" + "y" * 255), "amqp:invalid-field"),
    ],
)
def test_messages_that_are_not_events(message: Message, condition: str) -> None:
    with pytest.raises(BadMessage) as refused:
        message_to_event(message)
    assert refused.value.condition == condition


def test_a_partition_key_and_properties_are_the_events_attributes() -> None:
    """Read through the door's own decoder: the annotation is the key, the application
    properties but the producer's key are the properties, in order, values kept (what JSON has
    no room for as text)."""
    when = timestamp(1_767_323_045_678)  # 2026-01-02T03:04:05.678Z
    sent = Message(subject="T", body=1)
    sent.annotations = {symbol("x-opt-partition-key"): "order-7", symbol("x-opt-other"): 5}
    sent.properties = {  # type: ignore[assignment]
        KEY_PROPERTY: "dedup-1",
        "s": '{"$binary":"AA=="}',
        "b": b"\x00\xff",
        "n": ulong(2**64 - 1),
        "f": 1.5,
        "t": True,
        "none": None,
        "sym": symbol("x"),
        "c": char("\u2713"),
        "u": UUID,
        "when": when,
    }
    event = message_to_event(decode_message(sent.encode()))
    assert event.key == "dedup-1"  # the producer's key stays what it was, not a property
    assert event.attrs == EventAttrs(
        "order-7",
        (
            ("s", '{"$binary":"AA=="}'),
            ("b", b"\x00\xff"),
            ("n", 2**64 - 1),
            ("f", 1.5),
            ("t", True),
            ("none", None),
            ("sym", "x"),
            ("c", "\u2713"),
            ("u", str(UUID)),
            ("when", "2026-01-02T03:04:05.678Z"),
        ),
    )
    stored = stored_form(event.draft())[3]
    assert parse_attrs(stored) == event.attrs  # a text that reads like bytes stays text
    plain = message_to_event(decode_message(Message(subject="T", body=1).encode()))
    assert plain.attrs is None


@pytest.mark.parametrize("value", [[1], {"a": 1}, Described(symbol("d"), 1)])
def test_a_property_that_is_no_simple_value_is_refused(value: Any) -> None:
    sent = Message(subject="T", body=1, properties={"p": value})
    with pytest.raises(BadMessage) as refused:
        message_to_event(decode_message(sent.encode()))
    assert refused.value.condition == "amqp:invalid-field"
    assert "'p'" in str(refused.value)


def test_an_event_with_attributes_goes_out_with_them() -> None:
    attrs = EventAttrs(
        "order-7",
        (("s", "text"), ("b", b"\x00"), ("n", 2**64 - 1), ("n2", -1), ("r", 2.5), ("x", None)),
    )
    event = StoredEvent(EventId(7), "ORDER", '{"a":1}', TS, None, attrs_json(attrs))
    for event_hubs in (False, True):
        message = Message()
        message.decode(EventEncoder().encode(event, event_hubs))
        assert message.subject == "ORDER"
        assert message.annotations == {
            symbol("x-opt-offset"): format_offset(7),
            symbol("x-opt-sequence-number"): 7,
            symbol("x-opt-enqueued-time"): ts_to_ms(TS),
            symbol("x-opt-partition-key"): "order-7",
        }
        assert message.instructions == {
            symbol("event-streams-offset"): format_offset(7),
            symbol("event-streams-timestamp"): ts_to_ms(TS),
        }
        assert message.properties == {
            "s": "text", "b": b"\x00", "n": 2**64 - 1, "n2": -1, "r": 2.5, "x": None
        }  # fmt: skip
        assert message.body == ({"a": 1} if not event_hubs else b'{"a":1}')
    plain = decoded(7, '{"a":1}')
    assert plain.properties is None
    assert symbol("x-opt-partition-key") not in (plain.annotations or {})


def test_verbatim_kafka_headers_go_out_as_application_properties() -> None:
    """The last value of a name that repeats; not the headers the subject and content type
    carry; a key of bytes as binary."""
    attrs = EventAttrs(
        b"\x01k",
        (("ce_type", b"ORDER"), ("h", b"1"), ("content-type", b"text/plain"), ("h", b"2")),
        verbatim=True,
    )
    event = StoredEvent(
        EventId(3), "ORDER", '{"$binary":"AA=="}', TS, "text/plain", attrs_json(attrs)
    )
    message = Message()
    message.decode(EventEncoder().encode(event))
    assert message.properties == {"h": b"2"}
    assert message.annotations is not None
    assert message.annotations[symbol("x-opt-partition-key")] == b"\x01k"
    assert (message.body, message.content_type) == (b"\x00", "text/plain")


def test_two_filters_on_one_link_both_apply() -> None:
    def over(n: int) -> Any:
        return lambda event: event.id > n

    both = Position(5, 1000, over(7)).both(Position(6, None, over(3)))
    assert (both.after_id, both.after_ms) == (6, 1000)
    assert both.matches is not None
    assert [i for i in range(10) if both.matches(StoredEvent(EventId(i), "T", "1", TS))] == [
        8,
        9,
    ]
