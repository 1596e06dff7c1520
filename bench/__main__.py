"""``python -m bench [--quick] [--only NAME ...] [--runs N] [--json PATH]``

Starts each system itself on 127.0.0.1 (futoin-evt on SQLite and on a new PostgreSQL
database, the official FutoIn reference server; NATS JetStream is the machine's server,
started if it is down), runs every workload
``--runs`` times, and prints the median of each beside the others: futoin-evt, reference,
JetStream, the raw limit of the parts futoin-evt builds on, and the ratios
futoin-evt/reference and futoin-evt/raw limit. ``--quick`` uses small sizes and one run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from . import notify, others, postgres, systems, workloads
from .systems import System

RESULTS: Final = Path(__file__).resolve().parent / "results"

ADD_SERIAL: Final = "addEvent, 1 at a time (calls/s)"
ADD_32: Final = "addEvent, 32 in flight on 1 connection (calls/s)"
ADD_8: Final = "addEvent, 8 connections x 4 in flight (calls/s)"
DRAIN: Final = "poll drain (events/s)"
CATCH_UP: Final = "push catch-up (events/s)"
P50: Final = "push latency at 1,000/s p50 (ms)"
P99: Final = "push latency at 1,000/s p99 (ms)"
PMAX: Final = "push latency at 1,000/s max (ms)"
RSS_IDLE: Final = "server RSS, 1,000 idle connections (MB)"
RSS_LIVE: Final = "server RSS, 100 LIVE push consumers (MB)"
AMQP_PRODUCE: Final = "AMQP produce, 1 link, 1000 unsettled (msg/s)"
AMQP_CATCH_UP: Final = "AMQP consume catch-up, credit 1000 (msg/s)"
#: Rows where less is better: their ratios read "how many times lower".
LOWER_IS_BETTER: Final = (P50, P99, PMAX, RSS_IDLE, RSS_LIVE, *notify.LATENCY_ROWS)
SYSTEMS: Final = ("futoin-evt", "futoin-evt pg", "reference", "JetStream", "raw limit")


@dataclass(frozen=True)
class Sizes:
    add_serial: int
    add_in_flight: int
    drain: int
    latency_events: int
    idle_connections: int
    live_consumers: int
    #: Event notification: events through the selector; seconds of fan-out at 10k events/s.
    selector_events: int = 300_000
    fan_out_seconds: float = 5.0


FULL: Final = Sizes(3_000, 30_000, 100_000, 3_000, 1_000, 100)
QUICK: Final = Sizes(300, 3_000, 10_000, 500, 1_000, 100, selector_events=30_000,
                     fan_out_seconds=1.0)  # fmt: skip
#: The stream the fan-out subscribers follow (events/s).
FAN_OUT_RATE: Final = 10_000

Results = dict[str, list[float]]
Record = Callable[[str, float], None]


async def measure_ftn3(
    start: Callable[..., Awaitable[System]], sizes: Sizes, runs: int, *extra: str
) -> Results:
    results: Results = {}
    record = _recorder(results)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        async with systems.running(await start(Path(tmp), *extra, prefill=sizes.drain)) as system:
            for _ in range(runs):
                if system.amqp_url is not None:
                    await _measure_amqp(record, system.amqp_url, sizes)
                record(DRAIN, await workloads.poll_drain(system, sizes.drain))
                record(CATCH_UP, await workloads.push_catch_up(system, sizes.drain))
                record(ADD_SERIAL, await workloads.add_serial(system, sizes.add_serial))
                record(ADD_32, await workloads.add_in_flight(system, sizes.add_in_flight))
                record(ADD_8, await workloads.add_from_connections(system, sizes.add_in_flight))
                _record_latency(record, await workloads.push_latency(system, sizes.latency_events))
                record(RSS_IDLE, await workloads.rss_idle(system, sizes.idle_connections))
                record(RSS_LIVE, await workloads.rss_live_consumers(system, sizes.live_consumers))
    return results


async def measure_other(
    target: others.JetStream | others.RawLimits, sizes: Sizes, runs: int
) -> Results:
    """The workloads a system besides the FutoIn servers has (raw limits have no latency)."""
    results: Results = {}
    record = _recorder(results)
    for _ in range(runs):
        record(DRAIN, await target.poll_drain(sizes.drain))
        record(CATCH_UP, await target.push_catch_up(sizes.drain))
        record(ADD_SERIAL, await target.add_serial(sizes.add_serial))
        record(ADD_32, await target.add_in_flight(sizes.add_in_flight))
        record(ADD_8, await target.add_from_connections(sizes.add_in_flight))
        if isinstance(target, others.JetStream):
            _record_latency(record, await target.push_latency(sizes.latency_events))
        elif _has_proton():
            from . import amqp

            raw = await asyncio.to_thread(amqp.raw_limits, sizes.add_in_flight, sizes.drain)
            record(AMQP_PRODUCE, raw[amqp.RAW_PRODUCE])
            record(AMQP_CATCH_UP, raw[amqp.RAW_CONSUME])
    return results


def _has_proton() -> bool:
    """The AMQP rows need python-qpid-proton (the amqp extra)."""
    return importlib.util.find_spec("proton") is not None


async def _measure_amqp(record: Record, url: str, sizes: Sizes) -> None:
    """The AMQP rows: the same clients as the raw limit's, against futoin-evt's listener."""
    from . import amqp

    login: dict[str, Any] = {
        "user": systems.USER,
        "password": systems.PASSWORD,
        "allowed_mechs": "PLAIN",
    }
    consumer = amqp.Consumer(url, sizes.drain, **login)
    record(AMQP_CATCH_UP, await asyncio.to_thread(amqp.run, consumer))
    producer = amqp.Producer(url, sizes.add_in_flight, **login)
    record(AMQP_PRODUCE, await asyncio.to_thread(amqp.run, producer))


async def _measure_notify(record: Record, sizes: Sizes, runs: int) -> None:
    """Event notification, in this process: the selector alone, then live fan-out."""
    for _ in range(runs):
        record(notify.SELECTOR_ROW, notify.selector_throughput(sizes.selector_events))
        fan_out = await notify.fan_out(sizes.fan_out_seconds, FAN_OUT_RATE)
        for row, value in fan_out.items():
            record(row, value)


def _recorder(results: Results) -> Record:
    def record(row: str, value: float) -> None:
        results.setdefault(row, []).append(value)

    return record


def _record_latency(record: Record, latency: dict[str, float]) -> None:
    record(P50, latency["p50"])
    record(P99, latency["p99"])
    record(PMAX, latency["max"])


async def measure(name: str, sizes: Sizes, runs: int) -> Results:
    if name == "futoin-evt":
        amqp = ("--amqp", "127.0.0.1:0") if _has_proton() else ()
        results = await measure_ftn3(systems.start_futoin_evt, sizes, runs, *amqp)
        await _measure_notify(_recorder(results), sizes, runs)
        return results
    if name == "futoin-evt pg":
        return await measure_ftn3(postgres.start_futoin_evt_pg, sizes, runs)
    if name == "reference":
        return await measure_ftn3(systems.start_reference, sizes, runs)
    if name == "JetStream":
        others.ensure_nats()
        return await measure_other(others.JetStream(), sizes, runs)
    return await measure_other(others.RawLimits(), sizes, runs)


def _ratio(row: str, ours: float, theirs: float) -> str:
    if math.isnan(ours) or math.isnan(theirs) or not ours or not theirs:
        return "-"
    ratio = theirs / ours if row in LOWER_IS_BETTER else ours / theirs
    return f"{ratio:.2f}x"


def render(table: dict[str, dict[str, float]]) -> str:
    names = [n for n in SYSTEMS if n in table]
    rows_seen = list(dict.fromkeys(r for per in table.values() for r in per))
    header = ["workload", *names, "evt/reference", "evt/raw"]
    rows = [header]
    for row in rows_seen:
        digits = 2 if row in LOWER_IS_BETTER else 0
        values = {n: table[n].get(row, math.nan) for n in names}
        cells = ["-" if math.isnan(v) else f"{v:,.{digits}f}" for v in values.values()]
        ours = values.get("futoin-evt", math.nan)
        rows.append([
            row, *cells,
            _ratio(row, ours, values.get("reference", math.nan)),
            _ratio(row, ours, values.get("raw limit", math.nan)),
        ])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [" | ".join(_aligned(r, widths)) for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _aligned(row: list[str], widths: list[int]) -> list[str]:
    return [
        c.ljust(w) if i == 0 else c.rjust(w)
        for i, (c, w) in enumerate(zip(row, widths, strict=True))
    ]


async def main_async(args: argparse.Namespace) -> None:
    sizes = QUICK if args.quick else FULL
    runs = args.runs or (1 if args.quick else 3)
    raw: dict[str, Results] = {}
    for name in args.only or SYSTEMS:
        started = time.perf_counter()
        raw[name] = await measure(name, sizes, runs)
        print(f"# {name}: {time.perf_counter() - started:.0f} s", flush=True)
    medians = {n: {w: statistics.median(v) for w, v in per.items()} for n, per in raw.items()}
    print(render(medians))
    out = args.json or RESULTS / "latest.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "sizes": asdict(sizes),
        "runs": runs,
        "median": medians,
        "all": raw,
    }
    out.write_text(json.dumps(report, indent=2))
    print(f"# written to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, one run (CI)")
    parser.add_argument("--only", nargs="+", choices=SYSTEMS)
    parser.add_argument("--runs", type=int, help="runs per workload (default 3; --quick: 1)")
    parser.add_argument("--json", type=Path)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
