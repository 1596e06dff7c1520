"""``python -m bench.schemas [--runs N]``: what checking one event against a 10-property
schema costs, as the registry compiles it (jsonschema-rs, every draft) beside two libraries in
Python (fastjsonschema, which generates Python code for drafts 4, 6 and 7, and jsonschema),
with what compiling each costs.

The schema holds what event schemas hold: integers with a bound, a string with a pattern,
an enum, an array of objects, a nested object, a nullable string, closed to other
properties. Prints microseconds per call, the best of ``--runs`` runs.

``python -m bench`` measures what it costs a server (:func:`measure_enforcement`): addEvent of
the same 10-property data, of a type with the schema and of one without, in the same run.
``python -m bench.schemas --server {full,normal} [--runs N] [--events N]`` runs those rows
alone against a futoin-evt server on SQLite at that durability, and prints each row's median
rate and server CPU per event, and the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import timeit
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import fastjsonschema
import jsonschema.validators

from futoin_evt.domain.schemas import compile_schema, parse_schema

from . import systems, workloads
from .systems import System

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


#: The event type the server checks against :data:`SCHEMA`, and one it does not check.
TYPED: Final = "TYPED"
UNTYPED: Final = "UNTYPED"
#: What the server is started with (``systems.start_futoin_evt(schemas=...)``).
SUBJECTS: Final = {f"events-{TYPED}": json.dumps(SCHEMA)}
TYPED_SERIAL: Final = "addEvent, 10-property schema, 1 at a time (calls/s)"
UNTYPED_SERIAL: Final = "addEvent, 10-property data, no schema, 1 at a time (calls/s)"
TYPED_32: Final = "addEvent, 10-property schema, 32 in flight (calls/s)"
UNTYPED_32: Final = "addEvent, 10-property data, no schema, 32 in flight (calls/s)"


def add_params(event_type: str, count: int) -> list[str]:
    return [json.dumps({"type": event_type, "data": {**DATA, "order": i}}) for i in range(count)]


async def measure_enforcement(
    timed: Callable[[str, int, Awaitable[float]], Awaitable[None]],
    system: System,
    serial: int,
    in_flight: int,
) -> None:
    """The four rows: the same data, of the type the server checks and of one it does not,
    in the order untyped, typed, typed, untyped, half the events each time (what the store
    does as it grows falls on both alike). The validator is compiled before."""
    await workloads.add_serial(system, 1, add_params(TYPED, 1))
    pairs = (
        (serial, UNTYPED_SERIAL, TYPED_SERIAL, workloads.add_serial),
        (in_flight, UNTYPED_32, TYPED_32, workloads.add_in_flight),
    )
    for count, untyped, typed, workload in pairs:
        half = count // 2
        for row, event_type in (
            (untyped, UNTYPED),
            (typed, TYPED),
            (typed, TYPED),
            (untyped, UNTYPED),
        ):
            params = add_params(event_type, half)
            await timed(row, half, workload(system, half, params=params))


def best(call: Any, number: int, runs: int) -> float:
    """Microseconds per call, the best of ``runs``."""
    return min(timeit.repeat(call, number=number, repeat=runs)) / number * 1e6


async def measure_server(durability: str, runs: int, events: int) -> dict[str, float]:
    """The rows of :func:`measure_enforcement` (``events`` at 32 in flight, a tenth of them
    one at a time), the median of ``runs`` runs."""
    results: dict[str, list[float]] = {}

    async def timed(row: str, operations: int, work: Awaitable[float]) -> None:
        before = system.cpu_seconds()
        results.setdefault(row, []).append(await work)
        cpu = (system.cpu_seconds() - before) / operations * 1e6
        results.setdefault(row.rpartition(" (")[0] + ": server CPU (µs/op)", []).append(cpu)

    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        started = await systems.start_futoin_evt(Path(tmp), durability=durability, schemas=SUBJECTS)
        async with systems.running(started) as system:
            for _ in range(runs):
                await measure_enforcement(timed, system, events // 10, events)
    return {row: statistics.median(values) for row, values in results.items()}


def print_server(durability: str, runs: int, events: int) -> None:
    medians = asyncio.run(measure_server(durability, runs, events))
    for row, value in medians.items():
        print(f"{row:72} {value:12,.1f}")
    for typed, untyped in ((TYPED_SERIAL, UNTYPED_SERIAL), (TYPED_32, UNTYPED_32)):
        print(f"{typed}: {medians[typed] / medians[untyped]:.2f}x of {untyped}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--server", choices=("full", "normal"))
    parser.add_argument("--events", type=int, default=30_000)
    args = parser.parse_args()
    if args.server:
        print_server(args.server, args.runs, args.events)
        return
    schema = parse_schema(json.dumps(SCHEMA))
    draft7 = compile_schema(schema)
    later = parse_schema(
        json.dumps({"$schema": "https://json-schema.org/draft/2020-12/schema", **SCHEMA})
    )
    draft2020 = compile_schema(later)
    assert draft7.violation(DATA) is None
    assert draft2020.violation(DATA) is None
    generated = fastjsonschema.compile(SCHEMA, use_default=False)
    plain = jsonschema.validators.validator_for(SCHEMA)(SCHEMA)
    rows = [
        ("registry, draft-07", best(lambda: draft7.violation(DATA), 20000, args.runs)),
        ("registry, 2020-12", best(lambda: draft2020.violation(DATA), 20000, args.runs)),
        ("fastjsonschema (draft-07)", best(lambda: generated(DATA), 20000, args.runs)),
        ("jsonschema is_valid (draft-07)", best(lambda: plain.is_valid(DATA), 2000, args.runs)),
        ("compile: registry", best(lambda: compile_schema(schema), 200, args.runs)),
        (
            "compile: fastjsonschema",
            best(lambda: fastjsonschema.compile(SCHEMA, use_default=False), 20, args.runs),
        ),
    ]
    for name, micros in rows:
        print(f"{name:40} {micros:10.1f} µs")


if __name__ == "__main__":
    main()
