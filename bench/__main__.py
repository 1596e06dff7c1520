"""``python -m bench [--quick] [--only NAME ...] [--runs N] [--json PATH]``

Starts each system itself on 127.0.0.1, runs every workload ``--runs`` times, and prints the
median of each beside the others, with the ratio futoin-evt / reference.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from . import systems, workloads
from .systems import System

RESULTS: Final = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Sizes:
    add_serial: int
    add_in_flight: int
    drain: int
    latency_events: int


FULL: Final = Sizes(add_serial=3_000, add_in_flight=30_000, drain=100_000, latency_events=3_000)
QUICK: Final = Sizes(add_serial=500, add_in_flight=5_000, drain=20_000, latency_events=1_000)
#: Rows where less is better.
LATENCY_ROWS: Final = ("push latency p50 (ms)", "push latency p99 (ms)", "push latency max (ms)")

Starter = Callable[..., Awaitable[System]]
STARTERS: Final[dict[str, Starter]] = {
    "futoin-evt": systems.start_futoin_evt,
    "reference": systems.start_reference,
}


async def measure_system(name: str, sizes: Sizes, runs: int) -> dict[str, list[float]]:
    start = STARTERS[name]
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp:
        async with systems.running(await start(Path(tmp), prefill=sizes.drain)) as system:
            for _ in range(runs):
                record = functools.partial(_record, results)
                record("poll drain (events/s)", await workloads.poll_drain(system, sizes.drain))
                record(
                    "push catch-up (events/s)", await workloads.push_catch_up(system, sizes.drain)
                )
                record(
                    "addEvent, 1 at a time (calls/s)",
                    await workloads.add_serial(system, sizes.add_serial),
                )
                record(
                    "addEvent, 32 in flight (calls/s)",
                    await workloads.add_in_flight(system, sizes.add_in_flight),
                )
                latency = await workloads.push_latency(system, sizes.latency_events)
                for row, key in zip(LATENCY_ROWS, ("p50", "p99", "max"), strict=True):
                    record(row, latency[key])
    return results


def _record(results: dict[str, list[float]], row: str, value: float) -> None:
    results.setdefault(row, []).append(value)


def render(table: dict[str, dict[str, float]], names: list[str]) -> str:
    workloads_seen = list(dict.fromkeys(w for per in table.values() for w in per))
    header = ["workload", *names]
    if "futoin-evt" in names and "reference" in names:
        header.append("futoin-evt advantage")
    rows = [header]
    for workload in workloads_seen:
        digits = 2 if workload in LATENCY_ROWS else 0
        row = [workload] + [f"{table[n].get(workload, float('nan')):,.{digits}f}" for n in names]
        if len(header) > len(names) + 1:
            ours, theirs = table["futoin-evt"][workload], table["reference"][workload]
            ratio = theirs / ours if workload in LATENCY_ROWS else ours / theirs
            row.append(f"{ratio:.1f}x")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [
        " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    sizes = QUICK if args.quick else FULL
    names = args.only or list(STARTERS)
    raw: dict[str, dict[str, list[float]]] = {}
    for name in names:
        started = time.perf_counter()
        raw[name] = await measure_system(name, sizes, args.runs)
        print(f"# {name}: {time.perf_counter() - started:.0f} s", flush=True)
    medians = {n: {w: statistics.median(v) for w, v in per.items()} for n, per in raw.items()}
    print(render(medians, names))
    out = args.json or RESULTS / "latest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "machine": {
                    "cpus": __import__("os").cpu_count(),
                    "python": platform.python_version(),
                },
                "sizes": sizes.__dict__,
                "runs": args.runs,
                "median": medians,
                "all": raw,
            },
            indent=2,
        )
    )
    print(f"# written to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (CI)")
    parser.add_argument("--only", nargs="+", choices=list(STARTERS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
