"""An event type's JSON Schema as a Spark type, and event data fitted to it (no Spark session)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the [spark] extra is not installed")

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark_consumer.source import SourceOptions, record_batch
from spark_consumer.typed import spark_type, typed_value

S, L, D, B = StringType(), LongType(), DoubleType(), BooleanType()
ORDER = {
    "type": "object",
    "properties": {
        "order": {"type": "integer"},
        "total": {"type": "number"},
        "paid": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku"],
            },
        },
    },
    "required": ["order", "note"],
}
ORDER_TYPE = StructType([
    StructField("order", L, nullable=False),
    StructField("total", D),
    StructField("paid", B),
    StructField("note", S),  # required, but may be null
    StructField("lines", ArrayType(StructType([
        StructField("sku", S, nullable=False), StructField("qty", L)]))),
])  # fmt: skip


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer"}, L),
        ({"type": "number"}, D),
        ({"type": "string", "enum": ["a", "b"]}, S),
        ({"type": "boolean"}, B),
        ({"type": ["integer", "null"]}, L),
        (ORDER, ORDER_TYPE),
        ({"type": "array", "items": {"type": "number"}}, ArrayType(D)),
        ({"type": "array"}, ArrayType(S)),  # items of any shape: their JSON text
        ({"type": "array", "items": [{"type": "integer"}]}, ArrayType(S)),
        # what cannot be one Spark type: JSON text
        ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, S),
        ({"type": "integer", "anyOf": [{"minimum": 1}]}, S),
        ({}, S),
        ({"properties": {"a": {"type": "integer"}}}, S),  # no type
        ({"type": ["integer", "string"]}, S),
        ({"type": "object"}, S),  # no properties: Parquet has no empty struct
        ({"type": "null"}, S),
        (True, S),
        # local references are followed; one that loops or points nowhere is JSON text
        (
            {
                "type": "object",
                "properties": {"at": {"$ref": "#/definitions/ts"}},
                "definitions": {"ts": {"type": "integer"}},
            },
            StructType([StructField("at", L)]),
        ),
        (
            {"type": "object", "properties": {"next": {"$ref": "#"}, "n": {"type": "integer"}}},
            StructType(
                [
                    StructField("next", StructType([StructField("next", S), StructField("n", L)])),
                    StructField("n", L),
                ]
            ),
        ),
        ({"$ref": "#/nowhere"}, S),
        ({"$ref": "other.json"}, S),
    ],
)
def test_json_schema_to_spark_type(schema: Any, expected: DataType) -> None:
    assert spark_type(schema) == expected


@pytest.mark.parametrize(
    ("value", "data_type", "expected"),
    [
        (
            {
                "order": 7,
                "total": 9,
                "paid": True,
                "note": None,
                "extra": 1,
                "lines": [{"sku": "x", "qty": 2}, {"sku": "y"}],
            },
            ORDER_TYPE,
            {
                "order": 7,
                "total": 9.0,
                "paid": True,
                "note": None,
                "lines": [{"sku": "x", "qty": 2}, {"sku": "y", "qty": None}],
            },
        ),
        # an optional property that does not fit is null; a required one nulls its object
        (
            {"order": 7, "total": "9"},
            ORDER_TYPE,
            {"order": 7, "total": None, "paid": None, "note": None, "lines": None},
        ),
        ({"order": "7"}, ORDER_TYPE, None),
        (
            {"order": 7, "lines": [{"qty": 1}, 5]},
            ORDER_TYPE,
            {"order": 7, "total": None, "paid": None, "note": None, "lines": [None, None]},
        ),
        ([1], ORDER_TYPE, None),
        (True, L, None),  # a boolean is not an integer in JSON
        (1.0, L, 1),
        (1.5, L, None),
        (2**63, L, None),
        (False, D, None),
        (3, D, 3.0),
        (1, B, None),
        # JSON text for what is not a string
        ({"b": [1, "ü"]}, S, '{"b":[1,"ü"]}'),
        ("text", S, "text"),
        (None, ORDER_TYPE, None),
    ],
)
def test_data_fitted_to_its_type(value: Any, data_type: DataType, expected: Any) -> None:
    assert typed_value(value, data_type) == expected


TS = "2026-01-02T03:04:05Z"


def test_a_typed_batch_carries_data_as_a_struct() -> None:
    data_type = spark_type(ORDER)
    events = [
        {"id": "1", "type": "ORDER", "data": '{"order": 1, "note": "a"}', "ts": TS},
        {"id": "2", "type": "ORDER", "data": '{"order": "bad"}', "ts": TS},
    ]
    batch = record_batch(events, "orders", 1, data_type)
    assert batch.schema.field("data").type.field("order").nullable is False
    assert batch.column("data").to_pylist()[0]["order"] == 1
    assert batch.column("data").to_pylist()[1] is None
    assert batch.column("partition").to_pylist() == [1, 1]
    assert record_batch(events).column("data").to_pylist()[1] == '{"order": "bad"}'


@pytest.mark.parametrize(
    ("endpoint", "stream", "registry", "subject_stream"),
    [
        ("ws://h:1/", None, "http://h:1/schemas", "events"),
        ("ws://h:1", None, "http://h:1/schemas", "events"),
        ("ws://h:1/orders", None, "http://h:1/schemas", "orders"),
        ("secure+ws://h:1/orders/3/", None, "http://h:1/schemas", "orders"),
        ("wss://h/evt/orders/3", None, "https://h/evt/schemas", "orders"),
        ("ws://h:1/", "orders", "http://h:1/schemas", "orders"),
        ("wss://h/evt/", "orders", "https://h/evt/schemas", "orders"),
    ],
)
def test_the_registry_and_stream_of_an_endpoint(
    endpoint: str, stream: str | None, registry: str, subject_stream: str
) -> None:
    raw = {"endpoint": endpoint, "user": "u", "password": "p", "component": "C", "eventType": "T"}
    options = SourceOptions.parse({**raw, "stream": stream} if stream else raw)
    assert options.want == ("T",)
    assert options._server_url("/schemas") == registry
    assert options.subject_stream() == subject_stream


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"eventType": "A-B"}, "names one event type"),
        ({"eventType": ""}, "names one event type"),
        ({"eventType": "A", "want": "A"}, "leave 'want' out"),
    ],
)
def test_event_type_option_errors(extra: dict[str, str], message: str) -> None:
    raw = {"endpoint": "ws://h:1/", "user": "u", "password": "p", "component": "C", **extra}
    with pytest.raises(ValueError, match=message):
        SourceOptions.parse(raw)
