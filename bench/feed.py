"""``python -m bench.feed [--events N]``: how fast an HTTP feed client reads a backlog.

The server (a process of its own) starts with ``--events`` stored events in the stream
``events`` (one partition), and as many again in the stream ``bench`` with 4 partitions (a
quarter in each). A FeedAPI v2 client (httpx, one kept-alive connection) reads ``events``
from ``_first`` in pages of 1000; then a ZeroEventHub v1 client does the same. On ``bench``,
four FeedAPI v2 clients read a partition each, side by side (a worker per partition, as
FeedAPI consumers run), and one ZeroEventHub v1 client reads all four partitions in pages of
1000 shared by them. Beside them, the poll drain of ``events`` over FTN3 (BlockingClient,
pages of 1000, acknowledged).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
from pathlib import Path

import httpx

from futoin_evt.storage.tables import Tables

from .partitions import stream_keys
from .spark import plain_consumer, start_server
from .systems import PASSWORD, USER, prefill_rows, prepare_futoin_evt_db, print_figures

PARTITIONS = 4


def prepare_partitions(db: Path, events: int) -> None:
    """The stream ``bench`` with ``events`` events, a quarter in each partition."""
    keys = asyncio.run(stream_keys(str(db), PARTITIONS))
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN")
        for key in keys:
            conn.executemany(
                f"INSERT INTO {Tables.of(key).events} (type, data, ts, checksum)"
                " VALUES (?, ?, ?, ?)",
                prefill_rows(events // PARTITIONS),
            )
        conn.execute("COMMIT")
    finally:
        conn.close()


async def _lines(response: httpx.Response, cursors: dict[int, str]) -> int:
    """The events of a response; its cursors go into ``cursors`` by partition."""
    response.raise_for_status()
    events = 0
    for line in response.text.splitlines():
        message = json.loads(line)
        if "data" in message:
            events += 1
        elif "cursor" in message:
            cursors[message.get("partition", 0)] = message["cursor"]
    return events


async def read_partition(http: httpx.AsyncClient, feed_url: str, partition: int) -> int:
    """FeedAPI v2: one partition from ``_first`` to its end; how many events."""
    token = (await http.get(feed_url)).json()["token"]
    cursors, received = {0: "_first"}, 0
    while True:
        params = {"token": token, "partition": str(partition), "cursor": cursors[0]}
        events = await _lines(await http.get(feed_url + "/events", params=params), cursors)
        if not events:
            return received
        received += events


async def read_all(http: httpx.AsyncClient, feed_url: str, partitions: int) -> int:
    """ZeroEventHub v1: every partition in each request, to the end; how many events."""
    cursors, received = dict.fromkeys(range(partitions), "_first"), 0
    while True:
        params = {"n": str(partitions), **{f"cursor{k}": c for k, c in cursors.items()}}
        events = await _lines(await http.get(feed_url, params=params), cursors)
        if not events:
            return received
        received += events


async def read_feed(feed_url: str, expected: int, version: int, partitions: int = 1) -> float:
    """Events/s of FeedAPI v2 (a client per partition) or ZeroEventHub v1 (one client)."""
    clients = [
        httpx.AsyncClient(auth=(USER, PASSWORD), timeout=60)
        for _ in range(partitions if version == 2 else 1)
    ]
    try:
        start = time.perf_counter()
        if version == 2:
            counts = await asyncio.gather(
                *(read_partition(http, feed_url, k) for k, http in enumerate(clients))
            )
            received = sum(counts)
        else:
            received = await read_all(clients[0], feed_url, partitions)
        elapsed = time.perf_counter() - start
    finally:
        for http in clients:
            await http.aclose()
    assert received == expected, f"received {received} of {expected}"
    return expected / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.feed")
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args(argv)
    events = args.events - args.events % PARTITIONS
    with tempfile.TemporaryDirectory(prefix="bench-feed-") as tmp:
        db = Path(tmp) / "events.sqlite"
        prepare_futoin_evt_db(db, events)
        prepare_partitions(db, events)
        server, url = start_server(db)
        try:
            base = url.replace("ws", "http", 1).rstrip("/")
            feed, partitioned = base + "/feed", base + "/feeds/bench"
            results = {
                "FeedAPI v2, pages of 1000 (events/s)": asyncio.run(read_feed(feed, events, 2)),
                "ZeroEventHub v1, pages of 1000 (events/s)": asyncio.run(
                    read_feed(feed, events, 1)
                ),
                f"FeedAPI v2, {PARTITIONS} partitions, a client each (events/s)": asyncio.run(
                    read_feed(partitioned, events, 2, PARTITIONS)
                ),
                f"ZeroEventHub v1, {PARTITIONS} partitions, one client (events/s)": asyncio.run(
                    read_feed(partitioned, events, 1, PARTITIONS)
                ),
                "FTN3 poll drain, BlockingClient (events/s)": plain_consumer(
                    url, "POLL", events, None
                ),
            }
        finally:
            server.terminate()
            server.wait()
    print_figures(f"{events:,} events", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
