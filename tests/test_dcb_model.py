"""The DCB model without I/O: parsing both request forms, validation, matching."""

from __future__ import annotations

from typing import Any

import pytest

from futoin_evt.dcb.model import (
    parse_condition,
    parse_events,
    parse_query,
)
from futoin_evt.domain.dcb import AppendCondition, DcbInputError, Query, QueryItem, new_event

EVENTS = [
    ("CourseDefined", ["course:c1"]),
    ("StudentSubscribed", ["course:c1", "student:s1"]),
    ("StudentSubscribed", ["course:c2", "student:s1"]),
    ("CourseRenamed", ["course:c2"]),
    ("Untagged", []),
    ("Flagged", ["vip"]),
]


def matching(query: Query) -> list[int]:
    return [i for i, (t, tags) in enumerate(EVENTS) if query.matches(t, tags)]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (None, [0, 1, 2, 3, 4, 5]),
        ({"items": []}, [0, 1, 2, 3, 4, 5]),
        ({"items": [{}]}, [0, 1, 2, 3, 4, 5]),
        ({"items": [{"types": ["StudentSubscribed"]}]}, [1, 2]),
        ({"items": [{"tags": ["course:c1"]}]}, [0, 1]),
        ({"items": [{"tags": ["course:c1", "student:s1"]}]}, [1]),
        ({"items": [{"types": ["CourseDefined", "CourseRenamed"], "tags": ["course:c2"]}]}, [3]),
        ({"items": [{"tags": ["course:c1"]}, {"tags": ["course:c2"]}]}, [0, 1, 2, 3]),
        ({"items": [{"tags": ["vip"]}]}, [5]),
        ({"items": [{"tags": ["course"]}]}, []),  # current form: tags are exact
        ({"items": [{"types": ["Nothing"]}]}, []),
        # the draft's StreamQuery
        (
            {"version": "1.0", "criteria": [
                {"type": "EventTypes", "properties": {"event_types": ["CourseRenamed"]}},
                {"type": "Tags", "properties": {"tags": ["course:c1"]}},
            ]},
            [0, 1, 3],
        ),
        (
            {"criteria": [{"type": "EventTypesAndTags", "properties": {
                "event_types": ["StudentSubscribed"], "tags": ["course:c2"]}}]},
            [2],
        ),
        # a draft tag without a value is a wildcard over the key
        ({"criteria": [{"type": "Tags", "properties": {"tags": ["course"]}}]}, [0, 1, 2, 3]),
        ({"criteria": [{"type": "Tags", "properties": {"tags": ["student", "course:c2"]}}]}, [2]),
        ({"criteria": [{"type": "Tags", "properties": {"tags": ["vip"]}}]}, [5]),
    ],
)  # fmt: skip
def test_query_forms_match_the_same_events(query: Any, expected: list[int]) -> None:
    assert matching(parse_query(query)) == expected


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ([], "query"),
        ({"items": {}}, "query.items"),
        ({"items": [{"types": ["bad type"]}]}, "query.items[0].types[0]"),
        ({"items": [{"types": ["x" * 201]}]}, "query.items[0].types[0]"),
        ({"items": [{"tags": ["a:b:c"]}]}, "query.items[0].tags[0]"),
        ({"items": [{"tags": [":v"]}]}, "query.items[0].tags[0]"),
        ({"items": [{"tags": ["k" * 51]}]}, "query.items[0].tags[0]"),
        ({"items": [{"tags": [7]}]}, "query.items[0].tags[0]"),
        ({"items": [{"kinds": []}]}, "query.items[0].kinds"),
        ({"items": [{}] * 101}, "query.items"),
        ({"version": "2.0", "criteria": []}, "query.version"),
        ({"criteria": [{"type": "Nope", "properties": {}}]}, "query.criteria[0].type"),
        ({"criteria": [{"type": "Tags", "properties": {"tags": []}}]},
         "query.criteria[0].properties.tags"),
        ({"criteria": [{"type": "EventTypes", "properties": {"event_types": []}}]},
         "query.criteria[0].properties.event_types"),
        ({"criteria": [{"type": "Tags"}]}, "query.criteria[0]"),
    ],
)  # fmt: skip
def test_bad_queries_name_the_field(query: Any, field: str) -> None:
    with pytest.raises(DcbInputError) as refused:
        parse_query(query)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        (None, None),
        ({"failIfEventsMatch": {"items": [{"tags": ["a"]}]}, "after": 7},
         AppendCondition(Query((QueryItem(tags=frozenset({"a"})),)), 7)),
        ({"failIfEventsMatch": {"items": []}}, AppendCondition(Query(), None)),
        ({"query": {"criteria": []}, "expectedHighestSequenceNumber": "ANY"}, None),
        ({"query": {"criteria": []}, "expectedHighestSequenceNumber": "NONE"},
         AppendCondition(Query(), None)),
        ({"query": {"criteria": []}, "expectedHighestSequenceNumber": 12},
         AppendCondition(Query(), 12)),
    ],
)  # fmt: skip
def test_condition_forms(condition: Any, expected: AppendCondition | None) -> None:
    assert parse_condition(condition) == expected


@pytest.mark.parametrize(
    ("condition", "field"),
    [
        ({"after": 3}, "condition.failIfEventsMatch"),
        ({"failIfEventsMatch": {}, "after": -1}, "condition.after"),
        ({"failIfEventsMatch": {}, "after": "3"}, "condition.after"),
        ({"failIfEventsMatch": {}, "after": True}, "condition.after"),
        ({"failIfEventsMatch": {}, "before": 1}, "condition.before"),
        ({"query": {}, "expectedHighestSequenceNumber": "SOME"},
         "condition.expectedHighestSequenceNumber"),
    ],
)  # fmt: skip
def test_bad_conditions_name_the_field(condition: Any, field: str) -> None:
    with pytest.raises(DcbInputError) as refused:
        parse_condition(condition)
    assert refused.value.field == field


def test_events_are_checked_and_keep_their_data() -> None:
    events = parse_events([
        {"type": "A.b:c-d_1", "data": {"n": [1, 2.5, None, "é"]}, "tags": ["k:v", "k:v", "x"]},
        {"type": "B", "data": None, "id": "evt-1"},
    ])  # fmt: skip
    assert events[0].data_json == '{"n":[1,2.5,null,"é"]}'
    assert events[0].tags == ("k:v", "x")  # a repeated tag counts once
    assert (events[1].id, events[1].tags, events[1].data_json) == ("evt-1", (), "null")
    raw = new_event("Bin", b"\x00\xffdata")
    assert raw.is_bytes
    assert raw.data_bytes == b"\x00\xffdata"


@pytest.mark.parametrize(
    ("events", "field"),
    [
        ([], "events"),
        ({}, "events"),
        ([{"data": 1}], "events[0].type"),
        ([{"type": "has space"}], "events[0].type"),
        ([{"type": "A", "tags": "k:v"}], "events[0].tags"),
        ([{"type": "A", "tags": ["bad tag"]}], "events[0].tags[0]"),
        ([{"type": "A", "id": "not/an/id"}], "events[0].id"),
        ([{"type": "A", "id": "x" * 101}], "events[0].id"),
        ([{"type": "A", "colour": 1}], "events[0].colour"),
        ([{"type": "A", "id": "same"}, {"type": "B", "id": "same"}], "events"),
        ([{"type": "A"}] * 1001, "events"),
    ],
)
def test_bad_events_name_the_field(events: Any, field: str) -> None:
    with pytest.raises(DcbInputError) as refused:
        parse_events(events)
    assert refused.value.field == field


def test_same_content_is_what_makes_a_retry_idempotent() -> None:
    a = new_event("A", {"x": 1}, ["t:1", "u"], "id1")
    assert a.same_content(new_event("A", {"x": 1}, ["u", "t:1"], "id1"))
    assert not a.same_content(new_event("A", {"x": 2}, ["t:1", "u"], "id1"))
    assert not a.same_content(new_event("B", {"x": 1}, ["t:1", "u"], "id1"))
