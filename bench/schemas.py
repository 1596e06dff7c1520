"""``python -m bench.schemas [--runs N]``: what checking one event against a 10-property
schema costs, compiled by fastjsonschema (what the registry uses for drafts 4, 6 and 7) and
by jsonschema (2019-09 and 2020-12), with what compiling each costs.

The schema holds what event schemas hold: integers with a bound, a string with a pattern,
an enum, an array of objects, a nested object, a nullable string, closed to other
properties. Prints microseconds per call, the best of ``--runs`` runs.
"""

from __future__ import annotations

import argparse
import json
import timeit
from typing import Any, Final

import jsonschema.validators

from futoin_evt.domain.schemas import compile_schema, parse_schema

SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "order": {"type": "integer", "minimum": 0},
        "total": {"type": "string", "pattern": "^[0-9]+\\.[0-9]{2}$"},
        "currency": {"enum": ["EUR", "USD", "GBP"]},
        "customer": {"type": "string", "maxLength": 64},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
                "required": ["sku", "qty"],
            },
        },
        "paid": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "ts": {"type": "string"},
        "discount": {"type": "number"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
        },
    },
    "required": ["order", "total", "currency", "customer", "items", "paid"],
    "additionalProperties": False,
}
DATA: Final[dict[str, Any]] = {
    "order": 17,
    "total": "12.50",
    "currency": "EUR",
    "customer": "alice",
    "items": [{"sku": "A1", "qty": 2}, {"sku": "B2", "qty": 1}],
    "paid": True,
    "note": None,
    "ts": "2026-01-01T00:00:00Z",
    "discount": 0.5,
    "address": {"city": "Riga", "zip": "LV-1000"},
}


def best(call: Any, number: int, runs: int) -> float:
    """Microseconds per call, the best of ``runs``."""
    return min(timeit.repeat(call, number=number, repeat=runs)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    schema = parse_schema(json.dumps(SCHEMA))
    fast = compile_schema(schema)
    later = parse_schema(
        json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema", **SCHEMA})
    )
    full = compile_schema(later)
    assert fast.fast
    assert not full.fast
    assert fast.violation(DATA) is None
    assert full.violation(DATA) is None
    validator_class = jsonschema.validators.validator_for(SCHEMA)
    plain = validator_class(SCHEMA)
    rows = [
        (
            "fastjsonschema (registry, draft-07)",
            best(lambda: fast.violation(DATA), 20000, args.runs),
        ),
        ("jsonschema (registry, 2020-12)", best(lambda: full.violation(DATA), 2000, args.runs)),
        ("jsonschema is_valid (draft-07)", best(lambda: plain.is_valid(DATA), 2000, args.runs)),
        ("compile: fastjsonschema", best(lambda: compile_schema(schema), 20, args.runs)),
        ("compile: jsonschema", best(lambda: compile_schema(later), 200, args.runs)),
    ]
    for name, micros in rows:
        print(f"{name:40} {micros:10.1f} µs")


if __name__ == "__main__":
    main()
