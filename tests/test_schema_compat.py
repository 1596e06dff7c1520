"""Event schemas without I/O: subject names, what a registered schema may be, the compiled
validators, and the compatibility rules as tables of cases."""

from __future__ import annotations

import json
from typing import Any

import pytest

from futoin_evt.domain.schema_compat import incompatibilities, uncovered
from futoin_evt.domain.schemas import (
    Compatibility,
    InvalidCompatibility,
    InvalidSchema,
    InvalidSubject,
    InvalidVersion,
    compile_schema,
    parse_level,
    parse_schema,
    parse_subject,
    parse_version,
    top_properties,
)

OBJ: dict[str, Any] = {"type": "object"}


def schema(
    properties: dict[str, Any], required: tuple[str, ...] | list[str] = (), **more: Any
) -> dict[str, Any]:
    return {**OBJ, "properties": properties, "required": list(required), **more}


ORDER = {"order": {"type": "integer"}}
CLOSED: dict[str, Any] = {"additionalProperties": False}

#: (case, old, new, backward compatible, forward compatible)
CASES: list[tuple[str, Any, Any, bool, bool]] = [
    ("the same schema", schema(ORDER, ["order"]), schema(ORDER, ["order"]), True, True),
    ("required property added", schema(ORDER), schema(ORDER, ["order"]), False, True),
    ("required property removed", schema(ORDER, ["order"]), schema(ORDER), True, False),
    (
        "type widened, integer to number",
        schema(ORDER),
        schema({"order": {"type": "number"}}),
        True,
        False,
    ),
    (
        "type widened to a list",
        schema(ORDER),
        schema({"order": {"type": ["integer", "string"]}}),
        True,
        False,
    ),
    (
        "type changed",
        schema(ORDER),
        schema({"order": {"type": "string"}}),
        False,
        False,
    ),
    (
        "enum value added",
        schema({"c": {"enum": ["EUR", "USD"]}}),
        schema({"c": {"enum": ["EUR", "USD", "GBP"]}}),
        True,
        False,
    ),
    (
        "enum value removed",
        schema({"c": {"enum": ["EUR", "USD"]}}),
        schema({"c": {"enum": ["EUR"]}}),
        False,
        True,
    ),
    (
        "optional property added to a closed model",
        schema(ORDER, **CLOSED),
        schema({**ORDER, "note": {"type": "string"}}, **CLOSED),
        True,
        False,
    ),
    (
        "optional property added to an open model (Confluent's rule)",
        schema(ORDER),
        schema({**ORDER, "note": {"type": "string"}}),
        False,
        True,
    ),
    (
        "optional property removed from an open model",
        schema({**ORDER, "note": {"type": "string"}}),
        schema(ORDER),
        True,
        False,
    ),
    ("additionalProperties closed", schema(ORDER), schema(ORDER, **CLOSED), False, True),
    ("additionalProperties opened", schema(ORDER, **CLOSED), schema(ORDER), True, False),
    (
        "nested object: type narrowed",
        schema({"address": schema({"zip": {"type": ["string", "integer"]}})}),
        schema({"address": schema({"zip": {"type": "string"}})}),
        False,
        True,
    ),
    (
        "nested object: required property added",
        schema({"address": schema({"zip": {"type": "string"}})}),
        schema({"address": schema({"zip": {"type": "string"}}, ["zip"])}),
        False,
        True,
    ),
    (
        "array items narrowed",
        schema({"tags": {"type": "array", "items": {"type": ["string", "null"]}}}),
        schema({"tags": {"type": "array", "items": {"type": "string"}}}),
        False,
        True,
    ),
    (
        "maximum lowered",
        schema({"qty": {"type": "integer", "maximum": 10}}),
        schema({"qty": {"type": "integer", "maximum": 5}}),
        False,
        True,
    ),
    (
        "maxLength raised",
        schema({"name": {"type": "string", "maxLength": 10}}),
        schema({"name": {"type": "string", "maxLength": 20}}),
        True,
        False,
    ),
    (
        "anyOf branch added",
        {"anyOf": [{"type": "string"}]},
        {"anyOf": [{"type": "string"}, {"type": "null"}]},
        True,
        False,
    ),
    (
        "a $ref inside the schema, narrowed",
        {"$defs": {"n": {"type": "number"}}, **schema({"x": {"$ref": "#/$defs/n"}})},
        {"$defs": {"n": {"type": "integer"}}, **schema({"x": {"$ref": "#/$defs/n"}})},
        False,
        True,
    ),
    (
        "oneOf changed: not judged, refused both ways",
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
        False,
        False,
    ),
    (
        "only a description changed",
        schema(ORDER, description="v1"),
        schema(ORDER, description="v2"),
        True,
        True,
    ),
]


@pytest.mark.parametrize(
    ("old", "new", "backward", "forward"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_compatibility_cases(old: Any, new: Any, backward: bool, forward: bool) -> None:
    assert (not uncovered(new, old)) is backward, uncovered(new, old)
    assert (not uncovered(old, new)) is forward, uncovered(old, new)
    full = incompatibilities(Compatibility.FULL, new, [(1, old)])
    assert (full is None) is (backward and forward)
    assert incompatibilities(Compatibility.NONE, new, [(1, old)]) is None


def test_a_reason_names_the_place_and_what_narrows() -> None:
    old = schema({"address": schema({"zip": {"type": "string"}})})
    new = schema({"address": schema({"zip": {"type": "string"}}, ["zip"])})
    assert uncovered(new, old) == ['#/properties/address: required property "zip" added']


def test_transitive_levels_check_every_earlier_version() -> None:
    """v1 allowed strings, v2 dropped them, v3 (integers only) keeps BACKWARD with v2 but
    not with v1: only the transitive level sees it."""
    v1 = schema({"x": {"type": ["integer", "string"]}})
    v2 = schema({"x": {"type": "integer"}})
    v3 = schema({"x": {"type": "integer"}})
    earlier = [(2, v2), (1, v1)]
    assert incompatibilities(Compatibility.BACKWARD, v3, earlier) is None
    found = incompatibilities(Compatibility.BACKWARD_TRANSITIVE, v3, earlier)
    assert found is not None
    assert found[0] == 1


def test_recursive_schemas_are_judged_without_end() -> None:
    tree = {"$defs": {"n": schema({"child": {"$ref": "#/$defs/n"}})}, "$ref": "#/$defs/n"}
    assert uncovered(tree, tree) == []


@pytest.mark.parametrize(
    ("subject", "expected"),
    [
        ("orders-ORDER_PLACED", ("orders", "ORDER_PLACED")),
        ("my-orders-ORDER_PLACED", ("my-orders", "ORDER_PLACED")),
        ("events-course.defined:v1", ("events", "course.defined:v1")),
    ],
)
def test_a_subject_is_stream_dash_type(subject: str, expected: tuple[str, str]) -> None:
    assert parse_subject(subject) == expected


@pytest.mark.parametrize("subject", ["orders", "-T", "Orders-T", "orders-", "orders-T T", 5])
def test_other_subjects_are_refused(subject: Any) -> None:
    with pytest.raises(InvalidSubject) as refused:
        parse_subject(subject)
    assert refused.value.code == 42208


def test_levels_and_versions_as_given() -> None:
    assert parse_level("full_transitive") is Compatibility.FULL_TRANSITIVE
    assert Compatibility.FULL_TRANSITIVE.backward
    assert Compatibility.FULL_TRANSITIVE.forward
    with pytest.raises(InvalidCompatibility):
        parse_level("SIDEWAYS")
    assert parse_version("latest") is None
    assert parse_version("-1") is None
    assert parse_version("3") == 3
    for bad in ("0", "x", "1.5", "99999999999"):
        with pytest.raises(InvalidVersion):
            parse_version(bad)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{", "not JSON"),
        ("[1]", "an object or a boolean"),
        ('{"type": "objet"}', "#/type"),
        ('{"$ref": "http://example.com/s.json"}', "outside the schema"),
        ('{"properties": {"a": {"$ref": "file:///etc/passwd"}}}', "outside the schema"),
        ('{"$id": "http://example.com/", "type": "object"}', "may not name a place"),
    ],
)
def test_what_is_not_a_schema_is_refused_with_a_reason(text: str, why: str) -> None:
    with pytest.raises(InvalidSchema) as refused:
        parse_schema(text)
    assert why in str(refused.value)
    assert refused.value.code == 42201


def test_only_json_schemas_are_kept() -> None:
    with pytest.raises(InvalidSchema, match="JSON only"):
        parse_schema('{"type": "record", "name": "x", "fields": []}', "AVRO")


def test_the_text_kept_is_canonical() -> None:
    spaced = parse_schema('{ "type" : "object",\n "properties": {"b": {}, "a": {}} }')
    assert spaced.text == '{"type":"object","properties":{"b":{},"a":{}}}'
    assert parse_schema(spaced.text).fingerprint == spaced.fingerprint
    normalized = parse_schema(spaced.text, normalize=True)
    assert normalized.text == '{"properties":{"a":{},"b":{}},"type":"object"}'


TEN = schema(
    {
        "order": {"type": "integer", "minimum": 0},
        "total": {"type": "string", "pattern": "^[0-9]+\\.[0-9]{2}$"},
        "currency": {"enum": ["EUR", "USD"]},
        "items": {"type": "array", "items": schema({"sku": {"type": "string"}}, ["sku"])},
        "paid": {"type": "boolean"},
    },
    ["order", "total"],
)


@pytest.mark.parametrize("draft", [None, "https://json-schema.org/draft/2020-12/schema"])
def test_a_compiled_schema_names_the_first_failing_place(draft: str | None) -> None:
    document = TEN if draft is None else {"$schema": draft, **TEN}
    compiled = compile_schema(parse_schema(json.dumps(document)))
    assert compiled.violation({"order": 1, "total": "1.00", "items": [{"sku": "a"}]}) is None
    bad = compiled.violation({"order": 1, "total": "1.00", "items": [{"sku": 5}]})
    assert bad is not None
    assert bad.pointer == "/items/0/sku"
    missing = compiled.violation({"order": 1})
    assert missing is not None
    assert "total" in missing.reason


def test_top_properties_for_a_listing() -> None:
    assert top_properties(TEN)[:2] == [("order", "integer", True), ("total", "string", True)]
    assert ("currency", "", False) in top_properties(TEN)
