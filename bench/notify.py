"""Event notification: selector evaluation throughput, and live fan-out to many selector
subscribers of one stream, in the server's own process over a real SQLite file.

Fan-out: a producer appends at a fixed rate (a group every 10 ms, never waiting for each
event); :data:`SUBSCRIBERS` subscribers with different selectors read through the shared
reader as the doors do. A tenth of them match every event (different selectors that are all
true), the rest pin one of ten event types and a condition on the data. Latency is from the
append call to the subscriber holding the notification.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Final

from futoin_evt.log.eventlog import EventLog
from futoin_evt.notify.live import LiveEvents, Subscription
from futoin_evt.notify.message import Notification
from futoin_evt.notify.selector import compile_selector
from futoin_evt.storage import open_store

SELECTOR: Final = "eventType = 'ORDER_PLACED' AND total > 100 AND region IN ('EU', 'US')"
SUBSCRIBERS: Final = 100
TYPES: Final = tuple(f"TYPE_{letter}" for letter in "ABCDEFGHIJ")
TICK: Final = 0.01

SELECTOR_ROW: Final = "selector, 3 clauses (events/s)"
FAN_OUT_OFFERED: Final = "fan-out to 100 selectors: stream (events/s)"
FAN_OUT_ALL: Final = "fan-out: slowest match-all subscriber (events/s)"
FAN_OUT_P50: Final = "fan-out latency p50 (ms)"
FAN_OUT_P99: Final = "fan-out latency p99 (ms)"
LATENCY_ROWS: Final = (FAN_OUT_P50, FAN_OUT_P99)


def selector_throughput(count: int) -> float:
    """Notifications per second through a typical 3-clause selector (parsed once)."""
    regions = ("EU", "US", "APAC", "LATAM")
    notifications = [
        Notification(
            "ORDER_PLACED" if i % 3 else "ORDER_SHIPPED",
            i,
            "2026-11-23T10:00:00Z",
            {"total": i % 250, "region": regions[i % 4], "customer": f"c{i}", "items": i % 7},
        )
        for i in range(count)
    ]
    matches = compile_selector(SELECTOR).matches
    started = time.perf_counter()
    matched = sum(1 for n in notifications if matches(n))
    elapsed = time.perf_counter() - started
    assert 0 < matched < count
    return count / elapsed


def _selectors() -> list[str]:
    everything = SUBSCRIBERS // 10
    selectors = [f"amount >= {-i} OR amount IS NULL" for i in range(everything)]
    selectors += [
        f"eventType = '{TYPES[i % len(TYPES)]}' AND amount > {i % 50} AND region <> 'XX'"
        for i in range(SUBSCRIBERS - everything)
    ]
    return selectors


async def fan_out(seconds: float, rate: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="bench-notify-") as tmp:
        async with await open_store(Path(tmp) / "notify.sqlite") as store:
            return await _fan_out(EventLog(store), seconds, rate)


async def _fan_out(events: EventLog, seconds: float, rate: int) -> dict[str, float]:
    live = LiveEvents(events)
    subscriptions = [
        Subscription(live, None, compile_selector(s), events.head).start() for s in _selectors()
    ]
    finished = asyncio.Event()
    last_id = 0
    latencies: list[float] = []
    received = [0] * len(subscriptions)
    done_at = [0.0] * len(subscriptions)

    async def subscriber(index: int, subscription: Subscription) -> None:
        while True:
            subscription.wake.clear()
            batch = await subscription.poll(1000)
            if batch:
                now = time.perf_counter()
                received[index] += len(batch)
                done_at[index] = now
                latencies.extend(now - n.data["t"] for n in batch[::10])
                continue
            if subscription.has_more():
                continue
            if finished.is_set() and subscription.after_id >= last_id:
                return
            await subscription.wake.wait()

    readers = [asyncio.create_task(subscriber(i, s)) for i, s in enumerate(subscriptions)]
    per_tick = max(int(rate * TICK), 1)
    total = int(seconds / TICK) * per_tick
    started = time.perf_counter()
    appended: list[asyncio.Future[Any]] = []
    for tick in range(int(seconds / TICK)):
        for i in range(per_tick):
            n = tick * per_tick + i
            data = {"t": time.perf_counter(), "amount": n % 97, "region": "EU", "n": n}
            appended.append(events.append(TYPES[n % len(TYPES)], data))
        delay = started + (tick + 1) * TICK - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    ids = await asyncio.gather(*appended)
    offered_seconds = time.perf_counter() - started
    last_id = max(ids)
    finished.set()
    for subscription in subscriptions:
        subscription.wake.set()
    await asyncio.gather(*readers)
    for subscription in subscriptions:
        subscription.close()
    everything = SUBSCRIBERS // 10
    assert all(count == total for count in received[:everything])
    slowest = min(received[i] / (done_at[i] - started) for i in range(everything))
    latencies.sort()
    return {
        FAN_OUT_OFFERED: total / offered_seconds,
        FAN_OUT_ALL: slowest,
        FAN_OUT_P50: statistics.median(latencies) * 1000,
        FAN_OUT_P99: latencies[int(len(latencies) * 0.99)] * 1000,
    }
