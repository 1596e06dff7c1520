"""What is measured. Each workload returns a rate (per second) for one run."""

from __future__ import annotations

import asyncio
import itertools
import time

from futoin_evt.client.aio import EventStreamClient

from .systems import System, payload

_components = itertools.count(1)


async def connect(system: System) -> EventStreamClient:
    return await EventStreamClient.connect(system.url, credentials=system.credentials)


async def add_serial(system: System, count: int) -> float:
    """addEvent calls/s, one at a time on one connection."""
    async with await connect(system) as client:
        await client.add_event("WARMUP", None)
        start = time.perf_counter()
        for i in range(count):
            await client.add_event("ORDER", payload(i))
        return count / (time.perf_counter() - start)


async def add_in_flight(system: System, count: int, window: int = 32) -> float:
    """addEvent calls/s with ``window`` calls in flight on one connection."""
    async with await connect(system) as client:
        await client.add_event("WARMUP", None)
        per_worker = count // window

        async def worker(w: int) -> None:
            for i in range(per_worker):
                await client.add_event("ORDER", payload(w * per_worker + i))

        start = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(window)))
        return per_worker * window / (time.perf_counter() - start)


async def poll_drain(system: System, expected: int) -> float:
    """Events/s a new reliable consumer reads (and acknowledges) from a prefilled store."""
    component = f"DRAIN{next(_components)}"
    async with await connect(system) as client:
        await client.register_consumer(component)
        seen = 0
        last_id: int | None = None
        start = time.perf_counter()
        while seen < expected:
            events = await client.poll_events(component, last_id, iface=system.poll_iface)
            if not events:
                raise RuntimeError(f"{system.name}: drained only {seen} of {expected} events")
            seen += len(events)
            last_id = events[-1].id
        await client.poll_events(component, last_id, iface=system.poll_iface)  # acknowledge
        return seen / (time.perf_counter() - start)
