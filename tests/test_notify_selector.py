"""Selectors and transformations on their own: the case table, errors, push-down, shapes."""

from __future__ import annotations

import pytest

from futoin_evt.domain.notification import Notification
from futoin_evt.notify.message import NotifyError, Transformation
from futoin_evt.notify.selector import SelectorError, compile_selector

from .support.notify import BAD_SELECTORS, CASES, EVENTS

NOTIFICATIONS = [
    Notification(event_type, index + 1, "2026-11-23T10:00:00Z", data)
    for index, (event_type, data) in enumerate(EVENTS)
]


def test_the_table_is_large_enough() -> None:
    assert len(CASES) >= 60
    assert len({selector for selector, _ in CASES}) == len(CASES)


@pytest.mark.parametrize(("selector", "expected"), CASES)
def test_selector_matches(selector: str, expected: frozenset[int]) -> None:
    compiled = compile_selector(selector)
    matched = {n.id for n in NOTIFICATIONS if compiled.matches(n)}
    assert matched == expected


@pytest.mark.parametrize(("selector", "message"), BAD_SELECTORS)
def test_bad_selector_is_refused_with_a_reason(selector: str, message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        compile_selector(selector)


def test_syntax_error_points_at_its_column() -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector("total > 100 AND AND region = 'EU'")
    assert caught.value.column == 17
    assert "column 17" in str(caught.value)


@pytest.mark.parametrize(
    ("selector", "types"),
    [
        ("eventType = 'RARE'", {"RARE"}),
        ("'RARE' = eventType", {"RARE"}),
        ("eventType IN ('A', 'B') AND total > 1", {"A", "B"}),
        ("eventType IN ('A', 'B') AND eventType = 'B'", {"B"}),
        ("eventType = 'A' OR eventType IN ('B', 'C')", {"A", "B", "C"}),
        ("eventType = 'A' OR total > 1", None),
        ("eventType <> 'A'", None),
        ("eventType NOT IN ('A')", None),
        ("NOT eventType = 'A'", None),
        ("total > 1", None),
        ("eventType = 1", set()),
    ],
)
def test_pinned_event_types(selector: str, types: set[str] | None) -> None:
    pinned = compile_selector(selector).event_types
    assert (set(pinned) if pinned is not None else None) == types


def test_pinned_types_never_leave_out_a_match() -> None:
    for selector, expected in CASES:
        pinned = compile_selector(selector).event_types
        if pinned is not None:
            assert {n.id for n in NOTIFICATIONS if n.type in pinned} >= expected, selector


def test_transformation_keeps_requested_attributes_in_order() -> None:
    order = NOTIFICATIONS[0]
    shape = Transformation.parse({"requestedAttributes": ["total", "id", "missing", "order.items"]})
    assert list(shape.attributes(order).items()) == [("total", 150), ("id", 1), ("order.items", 3)]


def test_compact_transformation_is_values_with_null_for_missing() -> None:
    shape = Transformation.parse(
        {"requestedAttributes": ["eventType", "total", "carrier", "discount"], "compact": True}
    )
    assert [shape.values(n) for n in NOTIFICATIONS[:5]] == [
        ["ORDER_PLACED", 150, None, None],
        ["ORDER_PLACED", 80, None, None],
        ["ORDER_PLACED", 100, None, None],
        ["ORDER_SHIPPED", "150", "DHL", None],
        ["ORDER_SHIPPED", None, "UPS", None],
    ]


def test_a_null_attribute_is_kept_a_missing_one_left_out() -> None:
    shape = Transformation.parse({"requestedAttributes": ["discount", "missing"]})
    assert shape.attributes(NOTIFICATIONS[0]) == {"discount": None}


def test_full_attributes_are_base_then_scalar_fields() -> None:
    assert NOTIFICATIONS[0].attributes() == {
        "eventType": "ORDER_PLACED",
        "id": 1,
        "ts": "2026-11-23T10:00:00Z",
        "total": 150,
        "region": "EU",
        "customer": "alice",
        "express": True,
        "discount": None,
    }
    assert NOTIFICATIONS[7].attributes() == {
        "eventType": "USER_CREATED",
        "id": 8,
        "ts": "2026-11-23T10:00:00Z",
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([], "is a map"),
        ({}, "non-empty list"),
        ({"requestedAttributes": []}, "non-empty list"),
        ({"requestedAttributes": [1]}, "1-256 characters"),
        ({"requestedAttributes": ["a"], "compact": "yes"}, "compact must be a boolean"),
        ({"requestedAttributes": ["a"], "other": 1}, "unknown transformation entry"),
        ({"requestedAttributes": ["a"] * 300}, "at most 256"),
    ],
)
def test_bad_transformation_is_refused(spec: object, message: str) -> None:
    with pytest.raises(NotifyError, match=message):
        Transformation.parse(spec)


def test_without_its_type_tests_a_selector_agrees_on_the_pinned_types() -> None:
    """Readers that read only the pinned types skip the type tests; nothing else changes."""
    extra = ["eventType = 'RARE'", "eventType IN ('PAYMENT', 'NOTE') AND (amount > 0 OR x.y.z = 1)"]
    for selector in [s for s, _ in CASES] + extra:
        compiled = compile_selector(selector)
        if compiled.event_types is None:
            continue
        for n in NOTIFICATIONS:
            if n.type in compiled.event_types:
                assert bool(compiled.matches_of_pinned(n)) == bool(compiled.matches(n)), selector
