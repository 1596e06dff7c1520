"""What is measured. Each workload returns a rate (per second) for one run.

Every workload drives the server under test with :class:`~bench.loadgen.LoadClient`, the same
way for every system, so the figures are the server's rather than the client library's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time

from .loadgen import LoadClient
from .systems import System, payload

_components = itertools.count(1)
GEN = "futoin.evt.gen:1.1"


def add_params(count: int) -> list[str]:
    """addEvent params as JSON text, encoded before the clock starts."""
    return [json.dumps({"type": "ORDER", "data": payload(i)}) for i in range(count)]


async def connect(system: System) -> LoadClient:
    client = await LoadClient.connect(system.url, system.credentials)
    await client.call(f"{GEN}:addEvent", '{"type":"WARMUP","data":null}')  # authenticated once
    return client


async def add_serial(system: System, count: int) -> float:
    """addEvent calls/s, one at a time on one connection."""
    params = add_params(count)
    client = await connect(system)
    try:
        start = time.perf_counter()
        for p in params:
            await client.call(f"{GEN}:addEvent", p)
        return count / (time.perf_counter() - start)
    finally:
        await client.close()


async def add_in_flight(system: System, count: int, window: int = 32) -> float:
    """addEvent calls/s with ``window`` calls in flight on one connection."""
    per_worker = count // window
    params = add_params(per_worker * window)
    client = await connect(system)

    async def worker(w: int) -> None:
        for p in params[w * per_worker : (w + 1) * per_worker]:
            await client.call(f"{GEN}:addEvent", p)

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(window)))
        return per_worker * window / (time.perf_counter() - start)
    finally:
        await client.close()


async def poll_drain(system: System, expected: int) -> float:
    """Events/s a new reliable consumer reads (and acknowledges) from a prefilled store."""
    component = f"DRAIN{next(_components)}"
    poll = system.poll_iface
    client = await connect(system)
    try:
        await client.call(f"{poll}:registerConsumer", json.dumps({"component": component}))
        seen = 0
        last_id: str | None = None
        start = time.perf_counter()
        while seen < expected:
            params = {"component": component, "last_id": last_id}
            events = await client.call(f"{poll}:pollEvents", json.dumps(params))
            if not events:
                raise RuntimeError(f"{system.name}: drained only {seen} of {expected} events")
            seen += len(events)
            last_id = events[-1]["id"]
        params = {"component": component, "last_id": last_id}
        await client.call(f"{poll}:pollEvents", json.dumps(params))  # acknowledge the last
        return seen / (time.perf_counter() - start)
    finally:
        await client.close()
