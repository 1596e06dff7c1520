"""Event notification: selector evaluation throughput, and live fan-out to many selector
subscribers of one stream, in the server's own process over a real SQLite file, and through
a running server (``serve --workers N``) over FTN3.

Fan-out: a producer appends at a fixed rate (a group every 10 ms, never waiting for each
event); :data:`SUBSCRIBERS` subscribers with different selectors read through the shared
reader as the doors do. A tenth of them match every event (different selectors that are all
true), the rest pin one of ten event types and a condition on the data. Latency is from the
append call to the subscriber holding the notification.

``python -m bench.notify [--workers 1,2] [--rate N] [--seconds S] [--runs N] [--base DIR]``
runs the same fan-out against a server: every subscriber on its own connection (the kernel
spreads them over the workers; the rows say how many each got), the events added by
addEvent from :data:`PRODUCERS` connections, latency from the addEvent call to the
``onNotify`` that carries the event, in the bench's process; ``--base`` also runs the server
from another source tree (an earlier version), in turns with this one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from futoin_evt.domain.notification import Notification
from futoin_evt.domain.principal import Principal
from futoin_evt.domain.stream import EventDraft, UserId
from futoin_evt.log.eventlog import EventLog
from futoin_evt.notify.live import LiveEvents, Subscription
from futoin_evt.notify.selector import compile_selector
from futoin_evt.storage import open_store

SELECTOR: Final = "eventType = 'ORDER_PLACED' AND total > 100 AND region IN ('EU', 'US')"
SUBSCRIBERS: Final = 100
#: Who appends the events.
WRITER: Final = Principal(UserId(1), "bench", is_admin=True)
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
            gc.freeze()  # as ``serve`` does once it has started
            try:
                return await _fan_out(EventLog(store), seconds, rate)
            finally:
                gc.unfreeze()


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
    # only the appends in flight are held: a list of every one would be the heap that the
    # garbage collector's full passes walk (a server holds no such thing)
    in_flight: set[asyncio.Future[Any]] = set()
    newest = 0

    def appended(future: asyncio.Future[Any]) -> None:
        nonlocal newest
        in_flight.discard(future)
        newest = max(newest, future.result())

    for tick in range(int(seconds / TICK)):
        for i in range(per_tick):
            n = tick * per_tick + i
            data = {"t": time.perf_counter(), "amount": n % 97, "region": "EU", "n": n}
            append = events.append(WRITER, [EventDraft(TYPES[n % len(TYPES)], data)])
            in_flight.add(append)
            append.add_done_callback(appended)
        delay = started + (tick + 1) * TICK - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
    await asyncio.gather(*in_flight)
    offered_seconds = time.perf_counter() - started
    last_id = newest
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


# -- through a server ----------------------------------------------------------------------------

NOTIFY: Final = "futoin.evt.notify:1.0"
GEN: Final = "futoin.evt.gen:1.1"
#: Connections adding the events (spread over the workers like the subscribers).
PRODUCERS: Final = 4
SERVER_CPU: Final = "server CPU per event (us)"
_STAMP: Final = re.compile(rb'"t":([0-9.]+)')
SPREAD: Final = "subscribers per worker"


async def fan_out_server(
    workers: int, seconds: float, rate: int, source: Path | None = None
) -> dict[str, Any]:
    """The fan-out through ``serve --workers N`` (from ``source`` when given)."""
    from .systems import start_futoin_evt

    with tempfile.TemporaryDirectory(prefix="bench-notify-") as tmp:
        system = await start_futoin_evt(Path(tmp), "--workers", str(workers), source=source)
        try:
            return await fan_out_through(system, workers, seconds, rate)
        finally:
            await system.stop()


async def fan_out_through(system: Any, workers: int, seconds: float, rate: int) -> dict[str, Any]:
    """The fan-out through a running server of ``workers`` processes."""
    from .loadgen import LoadClient
    from .workers import _worker_of
    from .workloads import connect

    selectors = _selectors()
    clients: list[LoadClient] = [await connect(system) for _ in selectors]
    producers = [await connect(system) for _ in range(PRODUCERS)]
    placed = Counter(_worker_of(system, c) for c in clients) if workers > 1 else Counter([0] * 100)
    latencies: list[float] = []
    received = [0] * len(clients)
    done_at = [0.0] * len(clients)
    total = int(seconds / TICK) * max(int(rate * TICK), 1)
    everything = SUBSCRIBERS // 10
    all_in = asyncio.get_running_loop().create_future()

    def receiver(index: int, client: LoadClient) -> Callable[[bytes], None]:
        """Reads an ``onNotify`` without decoding its JSON (the bench's one core would
        otherwise bound the figures): the ``t`` of each event is there twice (a property
        and in the body), management events have none; other frames go to the client."""
        io, answer = client._io, client._on_message

        def on_message(frame: bytes) -> None:
            at = frame.rfind(b'"rid":"S')
            if at < 0:
                answer(frame)
                return
            now = time.perf_counter()
            rid = frame[at + 7 : frame.index(b'"', at + 7)]
            stamps = _STAMP.findall(frame)[::2]
            received[index] += len(stamps)
            done_at[index] = now
            latencies.extend(now - float(t) for t in stamps[index % 10 :: 10])
            if all(count >= total for count in received[:everything]) and not all_in.done():
                all_in.set_result(None)
            if io.is_open:
                io.send(b'{"r":true,"rid":"' + rid + b'"}')

        return on_message

    for index, (client, selector) in enumerate(zip(clients, selectors, strict=True)):
        client._io.on_message = receiver(index, client)
        await client.call(f"{NOTIFY}:subscribe", json.dumps({"selector": selector}))
    cpu_before = system.cpu_seconds()
    per_tick = max(int(rate * TICK), 1)
    started = time.perf_counter()
    calls: set[asyncio.Future[Any]] = set()
    for tick in range(int(seconds / TICK)):
        for i in range(per_tick):
            n = tick * per_tick + i
            data = {"t": time.perf_counter(), "amount": n % 97, "region": "EU", "n": n}
            params = json.dumps({"type": TYPES[n % len(TYPES)], "data": data})
            call = asyncio.ensure_future(producers[n % PRODUCERS].call(f"{GEN}:addEvent", params))
            calls.add(call)
            call.add_done_callback(calls.discard)
        delay = started + (tick + 1) * TICK - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)  # pacing the producer, not synchronisation
    await asyncio.gather(*calls)
    offered_seconds = time.perf_counter() - started
    async with asyncio.timeout(120):
        await all_in
    cpu = system.cpu_seconds() - cpu_before
    for client in [*clients, *producers]:
        await client.close()
    slowest = min(received[i] / (done_at[i] - started) for i in range(everything))
    latencies.sort()
    return {
        FAN_OUT_OFFERED: total / offered_seconds,
        FAN_OUT_ALL: slowest,
        FAN_OUT_P50: statistics.median(latencies) * 1000,
        FAN_OUT_P99: latencies[int(len(latencies) * 0.99)] * 1000,
        SERVER_CPU: cpu / total * 1e6,
        SPREAD: "/".join(str(count) for _, count in sorted(placed.items())),
    }


async def main_async(args: argparse.Namespace) -> None:
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    if args.base:
        trees.insert(0, ("base", Path(args.base)))
    results: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(args.runs):
        for workers in args.workers:
            for name, source in trees:
                run = await fan_out_server(workers, args.seconds, args.rate, source)
                results.setdefault((name, workers), []).append(run)
                print(name, f"--workers {workers}", _line(run), flush=True)
    print(f"\nmedian of {args.runs}, {args.rate:,} events/s for {args.seconds} s:")
    for (name, workers), runs in results.items():
        median = {row: statistics.median(r[row] for r in runs) for row in runs[0] if row != SPREAD}
        print(f"{name}, --workers {workers}:", _line(median))


def _line(figures: dict[str, Any]) -> str:
    return "; ".join(
        f"{row} {value:,.1f}" if isinstance(value, float) else f"{row} {value}"
        for row, value in figures.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.notify", description=__doc__)
    parser.add_argument("--workers", default="1,2", help="worker counts, comma-separated")
    parser.add_argument("--rate", type=int, default=10_000, help="events added per second")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--base", metavar="DIR", help="also run the server from this tree")
    args = parser.parse_args()
    args.workers = [int(w) for w in args.workers.split(",")]
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
