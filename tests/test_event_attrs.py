"""An event's attributes as stored: the exact round trip of every value type, the limits, and
their share of the event's size (no server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from futoin_evt.domain.attrs import (
    MAX_KEY_BYTES,
    MAX_NAME_CHARS,
    MAX_PROPERTIES,
    EventAttrs,
    attrs_json,
    parse_attrs,
)
from futoin_evt.domain.stream import (
    MAX_EVENT_DATA_BYTES,
    EventDraft,
    EventRejected,
    stored_form,
)

VALUES = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.binary(max_size=16)
    | st.builds(lambda b: json.dumps({"$binary": b}), st.text(max_size=8))
)
NAMES = st.text(min_size=1, max_size=MAX_NAME_CHARS)


@given(
    st.none() | st.text() | st.binary(max_size=32),
    st.lists(st.tuples(NAMES, VALUES), max_size=8),
    st.booleans(),
)
def test_every_value_comes_back_as_it_went_in(
    key: str | bytes | None, properties: list[tuple[str, Any]], verbatim: bool
) -> None:
    attrs = EventAttrs(key, tuple(properties), verbatim)
    stored = attrs_json(attrs)
    if key is None and not properties and not verbatim:
        assert stored is None
        return
    back = parse_attrs(stored)
    assert back == attrs
    assert back is not None
    # True stays a boolean, 1.0 a float, a text that reads like bytes a text
    assert [type(v) for _, v in back.properties] == [type(v) for _, v in properties]


def test_the_stored_form_is_compact_json() -> None:
    attrs = EventAttrs("k", (("h", b"\x00\xff"), ("h", '{"$binary":"AP8="}'), ("n", 1)), True)
    stored = attrs_json(attrs)
    assert stored == (
        '{"k":"k","p":[["h",{"$binary":"AP8="}],["h","{\\"$binary\\":\\"AP8=\\"}"],["n",1]],"v":1}'
    )
    assert attrs_json(EventAttrs(b"\x01", ())) == '{"k":{"$binary":"AQ=="}}'
    assert parse_attrs(None) is None


@pytest.mark.parametrize(
    ("attrs", "sentence"),
    [
        (EventAttrs("x" * (MAX_KEY_BYTES + 1)), f"exceeds {MAX_KEY_BYTES} bytes"),
        (EventAttrs("\u00e9" * (MAX_KEY_BYTES // 2 + 1)), f"exceeds {MAX_KEY_BYTES} bytes"),
        (EventAttrs(b"x" * (MAX_KEY_BYTES + 1)), f"exceeds {MAX_KEY_BYTES} bytes"),
        (EventAttrs(7), "text or bytes"),  # type: ignore[arg-type]
        (
            EventAttrs(None, (("n", 1),) * (MAX_PROPERTIES + 1)),
            f"at most {MAX_PROPERTIES} properties",
        ),
        (EventAttrs(None, (("", 1),)), f"1 to {MAX_NAME_CHARS} characters"),
        (EventAttrs(None, (("n" * (MAX_NAME_CHARS + 1), 1),)), "a property name"),
        (EventAttrs(None, (("f", float("nan")),)), "not a finite number"),
        (EventAttrs(None, (("l", [1]),)), "holds a list"),
    ],
)
def test_limits_are_refused_in_one_sentence(attrs: EventAttrs, sentence: str) -> None:
    with pytest.raises(EventRejected, match=sentence):
        attrs_json(attrs)


def test_limits_themselves_are_allowed() -> None:
    attrs = EventAttrs(
        "k" * MAX_KEY_BYTES, tuple((f"{n:0{MAX_NAME_CHARS}d}", n) for n in range(MAX_PROPERTIES))
    )
    assert parse_attrs(attrs_json(attrs)) == attrs


def test_attributes_count_toward_the_events_size() -> None:
    data = "x" * (MAX_EVENT_DATA_BYTES - 100)
    small = EventAttrs("k", (("h", "v"),))
    assert stored_form(EventDraft("T", data, attrs=small))[3] == attrs_json(small)
    with pytest.raises(EventRejected, match="data and attributes together exceed"):
        stored_form(EventDraft("T", data, attrs=EventAttrs("k" * 200)))
    assert stored_form(EventDraft("T", 1))[3] is None
