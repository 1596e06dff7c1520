"""The SQL and selector filters: text to start position and predicate, by tables of cases."""

from __future__ import annotations

import pytest

from futoin_evt.amqp.codec import BadFilter
from futoin_evt.amqp.filters import compile_filter
from futoin_evt.domain.stream import EventId, StoredEvent

HEAD = 100
# id 10 was added at 2024-01-01T00:00:10Z: 1704067210000 ms
TEN_MS = 1_704_067_210_000


def event(event_id: int) -> StoredEvent:
    return StoredEvent(EventId(event_id), "T", "1", f"2024-01-01T00:00:{event_id:02d}Z")


def selected(text: str, ids: range = range(1, 31)) -> list[int]:
    position = compile_filter(text, head=HEAD)
    assert position.matches is not None
    return [i for i in ids if i > position.after_id and position.matches(event(i))]


@pytest.mark.parametrize(
    ("text", "after_id", "after_ms"),
    [
        ("d.event-streams-offset > '00000000000000000010'", 10, None),
        ("delivery_annotations.event-streams-offset >= '00000000000000000010'", 9, None),
        ("D.EVENT-STREAMS-OFFSET = '00000000000000000010'", 9, None),
        ("'00000000000000000010' < d.event-streams-offset", 10, None),
        ("d.event-streams-offset > '@earliest'", 0, None),
        ("d.event-streams-offset > '@latest'", HEAD, None),
        ("d.event-streams-offset < '00000000000000000010'", 0, None),
        ("d.event-streams-timestamp > 1585672841000", 0, 1585672841000),
        ("d.event-streams-timestamp >= 1585672841000", 0, 1585672840999),
        ("amqp.annotation.x-opt-offset > '-1'", 0, None),
        ("amqp.annotation.x-opt-offset > '42'", 42, None),
        ("amqp.annotation.x-opt-offset >= '@latest'", HEAD - 1, None),
        ("amqp.annotation.x-opt-sequence-number > 7", 7, None),
        ("amqp.annotation.x-opt-enqueued-time > '1700000000000'", 0, 1700000000000),
        (
            "d.event-streams-offset > '00000000000000000005'"
            " AND d.event-streams-timestamp > 1000 AND TRUE",
            5,
            1000,
        ),
        (
            "d.event-streams-offset > '00000000000000000005' OR"
            " d.event-streams-offset > '00000000000000000009'",
            5,
            None,
        ),
        ("d.event-streams-offset > '00000000000000000005' OR TRUE", 0, None),
        ("(TRUE)", 0, None),
    ],
)
def test_start_positions(text: str, after_id: int, after_ms: int | None) -> None:
    position = compile_filter(text, head=HEAD)
    assert (position.after_id, position.after_ms) == (after_id, after_ms)


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("d.event-streams-offset > '00000000000000000027'", [28, 29, 30]),
        ("d.event-streams-offset <= '00000000000000000002'", [1, 2]),
        ("d.event-streams-offset <> '00000000000000000002' AND d.x-opt-offset < 1", "error"),
        (f"d.event-streams-timestamp > {TEN_MS + 17_000}", [28, 29, 30]),
        (f"d.event-streams-timestamp >= {TEN_MS + 20_000}", [30]),
        (f"d.event-streams-timestamp > {TEN_MS + 19_999}", [30]),
        (
            "d.event-streams-offset < '00000000000000000003' OR"
            " d.event-streams-offset > '00000000000000000028'",
            [1, 2, 29, 30],
        ),
        (
            "(d.event-streams-offset > '00000000000000000002' or false) and"
            " amqp.annotation.x-opt-sequence-number < 5",
            [3, 4],
        ),
        ("amqp.annotation.x-opt-enqueued-time < " + str(TEN_MS - 8_000), [1]),
        ("FALSE", []),
    ],
)
def test_selected_events(text: str, ids: list[int] | str) -> None:
    if ids == "error":
        with pytest.raises(BadFilter):
            selected(text)
    else:
        assert selected(text) == ids


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "cannot parse"),
        ("d.event-streams-offset >", "cannot parse"),
        ("d.event-streams-offset > 'x' AND", "cannot parse"),
        ("d.event-streams-offset ~ 'x'", "cannot parse"),
        ("d.event-streams-offset > 'it''s'", "not an offset"),
        ("d.event-streams-offset > 5", "compared with strings"),
        ("d.event-streams-timestamp > 'soon'", "compared with a number"),
        ("d.colour = 'red'", "cannot filter on delivery_annotations.colour"),
        ("properties.subject = 'T'", "cannot parse"),
        ("1 = 1", "one field and one constant"),
        ("d.event-streams-offset = d.event-streams-offset", "one field and one constant"),
        ("TRUE " * 2000, "longer than"),
        ("((((((TRUE", "cannot parse"),
    ],
)
def test_bad_filters(text: str, reason: str) -> None:
    with pytest.raises(BadFilter, match=reason):
        compile_filter(text, head=HEAD)
