"""Events to AMQP messages and back, without sockets: what a consumer decodes is the event."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from proton import Data, Described, Message, symbol, ulong

from futoin_evt.amqp.codec import (
    DEFAULT_EVENT_TYPE,
    BadMessage,
    EventEncoder,
    Position,
    format_offset,
    message_to_event,
)
from futoin_evt.domain.stream import EventId, StoredEvent, stored_form, ts_to_ms

TS = "2026-11-23T08:00:05Z"


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
        _type, data_json, kept = stored_form(message_to_event(sent).draft())
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
    event_type, data_json, kept = stored_form(event.draft())
    assert (event_type, data_json, kept) == ("EVENT", text, content_type)
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
    assert stored_form(message_to_event(sent).draft())[1:] == ('{"k":[1,2]}', "application/json")


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
