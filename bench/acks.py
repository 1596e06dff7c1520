"""``python -m bench.acks [--count N] [--runs N] [--source DIR]``: what an acknowledgement costs.

One futoin-evt server on SQLite (``--durability full``) with a prefilled backlog; a reliable
consumer acknowledges it one event at a time, through ``futoinevt.ops:1.0:acknowledge``
(one call after another, and 32 in flight on one connection) and through ``pollEvents``
with ``want`` naming a type no event has (each poll acknowledges ``last_id`` and reads
nothing). Prints calls/s and the server's CPU per call (µs), the median of ``--runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from .loadgen import LoadClient
from .systems import System, print_figures, process_cpu_seconds, running, start_futoin_evt
from .workloads import connect

OPS: Final = "futoinevt.ops:1.0"
POLL: Final = "futoin.evt.poll:1.1"
_components = itertools.count(1)


async def _consumer(system: System) -> tuple[LoadClient, str]:
    client = await connect(system)
    component = f"ACK{next(_components)}"
    await client.call(f"{POLL}:registerConsumer", json.dumps({"component": component}))
    return client, component


async def acknowledge_serial(system: System, count: int) -> tuple[float, float]:
    """(calls/s, server µs per call) of ``acknowledge``, one at a time."""
    client, component = await _consumer(system)
    calls = [json.dumps({"component": component, "last_id": str(i)}) for i in range(1, count + 1)]
    return await _timed(system, count, lambda: _each(client, f"{OPS}:acknowledge", calls))


async def acknowledge_in_flight(
    system: System, count: int, window: int = 32
) -> tuple[float, float]:
    """(calls/s, server µs per call) of ``acknowledge``, ``window`` in flight."""
    client, component = await _consumer(system)
    per = count // window

    async def worker(w: int) -> None:
        for i in range(w * per + 1, (w + 1) * per + 1):
            params = json.dumps({"component": component, "last_id": str(i)})
            await client.call(f"{OPS}:acknowledge", params)

    async def run() -> None:
        await asyncio.gather(*(worker(w) for w in range(window)))

    return await _timed(system, per * window, run)


async def poll_acknowledge(system: System, count: int) -> tuple[float, float]:
    """(calls/s, server µs per call) of ``pollEvents`` that acknowledge and read nothing."""
    client, component = await _consumer(system)
    calls = [
        json.dumps({"component": component, "last_id": str(i), "want": ["NO_SUCH_TYPE"]})
        for i in range(1, count + 1)
    ]
    return await _timed(system, count, lambda: _each(client, f"{POLL}:pollEvents", calls))


async def _each(client: LoadClient, function: str, calls: list[str]) -> None:
    for params in calls:
        await client.call(function, params)


async def _timed(
    system: System, count: int, run: Callable[[], Awaitable[None]]
) -> tuple[float, float]:
    cpu = process_cpu_seconds(system.process.pid)
    start = time.perf_counter()
    await run()
    elapsed = time.perf_counter() - start
    used = process_cpu_seconds(system.process.pid) - cpu
    return count / elapsed, used / count * 1e6


ROWS: Final = {
    "acknowledge, 1 at a time": acknowledge_serial,
    "acknowledge, 32 in flight": acknowledge_in_flight,
    "pollEvents acknowledging, nothing wanted": poll_acknowledge,
}


async def main(count: int, runs: int, source: Path | None = None) -> None:
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(runs):
            work = Path(tmp) / str(run)
            work.mkdir()
            async with running(
                await start_futoin_evt(work, prefill=count, source=source)
            ) as system:
                for name, workload in ROWS.items():
                    results[name].append(await workload(system, count))
    figures: dict[str, float] = {}
    for name, measured in results.items():
        figures[f"{name} (calls/s)"] = statistics.median(r[0] for r in measured)
        figures[f"{name}: server CPU (µs/op)"] = statistics.median(r[1] for r in measured)
    print_figures("acknowledgements", figures)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--source", type=Path, help="run futoin-evt from this source tree")
    args = parser.parse_args()
    asyncio.run(main(args.count, args.runs, args.source))
