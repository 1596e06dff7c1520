"""What is measured. Each workload returns a rate (per second) for one run.

Every workload drives the server under test with :class:`~bench.loadgen.LoadClient`, the same
way for every system, so the figures are the server's rather than the client library's.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

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


async def add_serial(system: System, count: int, params: list[str] | None = None) -> float:
    """addEvent calls/s, one at a time on one connection (``params``: those of each call)."""
    params = params or add_params(count)
    client = await connect(system)
    try:
        start = time.perf_counter()
        for p in params:
            await client.call(f"{GEN}:addEvent", p)
        return count / (time.perf_counter() - start)
    finally:
        await client.close()


async def add_in_flight(
    system: System, count: int, window: int = 32, params: list[str] | None = None
) -> float:
    """addEvent calls/s with ``window`` calls in flight on one connection (``params``: those
    of each call, at least ``count``)."""
    per_worker = count // window
    params = params or add_params(per_worker * window)
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


async def push_catch_up(system: System, expected: int) -> float:
    """Events/s pushed to a new reliable consumer from a prefilled store (it acks each group)."""
    component = f"PUSH{next(_components)}"
    push = "futoin.evt.push:1.1"
    client = await connect(system)
    received = 0
    done = asyncio.get_running_loop().create_future()

    def on_events(msg: dict[str, Any]) -> bool:
        nonlocal received
        received += len(msg["p"]["events"])
        if received >= expected and not done.done():
            done.set_result(None)
        return True

    client.on_push = on_events
    try:
        await client.call(f"{push}:registerConsumer", json.dumps({"component": component}))
        start = time.perf_counter()
        await client.call(f"{push}:readyToReceive", json.dumps({"component": component}))
        async with asyncio.timeout(600):
            await done
        return received / (time.perf_counter() - start)
    finally:
        await client.close()


async def push_latency(
    system: System, count: int, rate: float = 1000.0, *, add_to: System | None = None
) -> dict[str, float]:
    """addEvent -> reliable receiver latency (ms) with events added at ``rate`` per second;
    added through ``add_to`` when given (another server process on the same database)."""
    receiver = await connect(system)
    producer = await connect(add_to or system)
    try:
        return await push_latency_on(receiver, producer, count, rate)
    finally:
        await receiver.close()
        await producer.close()


async def push_latency_on(
    receiver: LoadClient, producer: LoadClient, count: int, rate: float = 1000.0
) -> dict[str, float]:
    """:func:`push_latency` on these two connections (left open)."""
    component = f"LAT{next(_components)}"
    push = "futoin.evt.push:1.1"
    latencies: list[float] = []
    done = asyncio.get_running_loop().create_future()

    def on_events(msg: dict[str, Any]) -> bool:
        now = time.perf_counter()
        for event in msg["p"]["events"]:
            if event["type"] == "LATENCY":
                latencies.append((now - event["data"]["t"]) * 1000)
        if len(latencies) >= count and not done.done():
            done.set_result(None)
        return True

    receiver.on_push = on_events
    await receiver.call(f"{push}:registerConsumer", json.dumps({"component": component}))
    # start at the newest event: acknowledge everything earlier workloads added
    newest = await producer.call(f"{GEN}:addEvent", '{"type":"MARK","data":null}')
    ack = {"component": component, "last_id": newest}
    await receiver.call(f"{push}:pollEvents", json.dumps(ack))
    await receiver.call(f"{push}:readyToReceive", json.dumps({"component": component}))
    start = time.perf_counter()
    in_flight: set[asyncio.Future[Any]] = set()
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the producer, not synchronisation
        params = json.dumps({"type": "LATENCY", "data": {"t": time.perf_counter(), "i": i}})
        call = asyncio.ensure_future(producer.call(f"{GEN}:addEvent", params))
        in_flight.add(call)
        call.add_done_callback(in_flight.discard)
    async with asyncio.timeout(120):
        await done
        # the producer's last calls may not be answered yet: a server must not see them
        # cut off by the close (the reference server exits on that)
        await asyncio.gather(*in_flight)
    ordered = sorted(latencies[:count])
    return {
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[int(len(ordered) * 0.99)],
        "max": ordered[-1],
    }


async def add_from_connections(system: System, count: int, connections: int = 8) -> float:
    """addEvent calls/s from ``connections`` connections, 4 in flight on each."""
    per_worker = count // (connections * 4)
    params = add_params(per_worker)
    clients = [await connect(system) for _ in range(connections)]

    async def worker(client: LoadClient) -> None:
        for p in params:
            await client.call(f"{GEN}:addEvent", p)

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker(c) for c in clients for _ in range(4)))
        return per_worker * connections * 4 / (time.perf_counter() - start)
    finally:
        for client in clients:
            await client.close()


async def rss_idle(system: System, connections: int) -> float:
    """Server RSS (MB) with ``connections`` open, authenticated, idle connections."""
    clients = [await connect(system) for _ in range(connections)]
    try:
        return system.rss_kib() / 1024
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def rss_live_consumers(system: System, consumers: int) -> float:
    """Server RSS (MB) with ``consumers`` LIVE push consumers while events flow."""
    push = "futoin.evt.push:1.1"
    clients = [await connect(system) for _ in range(consumers)]
    try:
        for client in clients:
            client.on_push = lambda _msg: True
            await client.call(f"{push}:readyToReceive", '{"component":"LIVE"}')
        producer = clients[0]
        for batch in range(10):
            await asyncio.gather(*(producer.call(f"{GEN}:addEvent", p) for p in add_params(100)))
            del batch
        return system.rss_kib() / 1024
    finally:
        await asyncio.gather(*(c.close() for c in clients))
