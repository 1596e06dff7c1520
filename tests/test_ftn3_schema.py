"""FTN3 types compiled to JSON Schema."""

from __future__ import annotations

from typing import Any

import pytest

from futoin_evt.ftn3.schema import TypeCompiler, js_regex

TYPES: dict[str, Any] = {
    "Small": {"type": "integer", "min": 1, "max": 10},
    "Smaller": {"type": "Small", "max": 5},
    "Name": {"type": "string", "regex": "^[a-z]+$", "minlen": 2, "maxlen": 4},
    "Alias": "Name",
    "Either": ["Small", "Name"],
    "Point": {
        "type": "map",
        "fields": {
            "x": "number",
            "y": {"type": "number"},
            "label": {"type": "Name", "optional": True},
        },
    },
    "Scores": {"type": "map", "elemtype": "Small"},
    "Names": {"type": "array", "elemtype": "Name", "minlen": 1, "maxlen": 2},
    "Color": {"type": "enum", "items": ["red", "green"]},
    "Colors": {"type": "set", "items": ["red", "green"]},
}


def valid(ref: str, value: Any) -> bool:
    validator = TypeCompiler(TYPES).validator(ref)
    return validator is None or bool(validator.is_valid(value))


@pytest.mark.parametrize(
    ("ref", "good", "bad"),
    [
        ("Small", [1, 10], [0, 11, 2.5, "3", True]),
        ("Smaller", [1, 5], [6, 0]),
        ("Name", ["ab", "abcd"], ["a", "abcde", "AB", "ab1", 5]),
        ("Alias", ["ab"], ["a"]),
        ("Either", [3, "ab"], [20, "A"]),
        (
            "Point",
            [{"x": 1, "y": 2.5}, {"x": 1, "y": 2, "label": None}],
            [{"x": 1}, {"x": "1", "y": 1}, [], {"x": 1, "y": 1, "label": "A"}],
        ),
        ("Scores", [{}, {"a": 1}], [{"a": 0}, {"a": "1"}]),
        ("Names", [["ab"], ["ab", "cd"]], [[], ["ab", "cd", "ef"], ["A"], "ab"]),
        ("Color", ["red"], ["blue"]),
        ("Colors", [["red", "green"], []], [["red", "red"], ["blue"]]),
        ("boolean", [True, False], [0, None]),
        ("number", [1, 1.5], ["1", True]),
    ],
)
def test_types(ref: str, good: list[Any], bad: list[Any]) -> None:
    for value in good:
        assert valid(ref, value), value
    for value in bad:
        assert not valid(ref, value), value


def test_any_needs_no_validator() -> None:
    assert TypeCompiler({}).validator("any") is None


def test_unknown_and_recursive_types_are_spec_errors() -> None:
    with pytest.raises(ValueError, match="unknown type"):
        TypeCompiler({}).schema("Nope")
    with pytest.raises(ValueError, match="recursive type"):
        TypeCompiler({"A": "B", "B": "A"}).schema("A")


def test_regexes_mean_what_they_mean_in_javascript() -> None:
    assert js_regex("^[A-Z]+$").search("ABC\n") is None  # Python's $ would match before \n
    assert js_regex(r"^\d+$").search("١٢") is None  # \d is ASCII only in JS
    assert js_regex("^[$]$").search("$") is not None
    assert js_regex(r"^a\$$").search("a$") is not None
