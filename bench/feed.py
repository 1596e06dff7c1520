"""``python -m bench.feed [--events N]``: how fast an HTTP feed client reads a backlog.

The server (a process of its own) starts with ``--events`` stored events. A FeedAPI v2 client
(httpx, one kept-alive connection) reads them from ``_first`` in pages of 1000; then a
ZeroEventHub v1 client does the same. Beside them, the poll drain of the same server over
FTN3 (BlockingClient, pages of 1000, acknowledged).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

import httpx

from .spark import plain_consumer, start_server
from .systems import PASSWORD, USER, prepare_futoin_evt_db, print_figures


async def read_feed(feed_url: str, expected: int, version: int) -> float:
    async with httpx.AsyncClient(auth=(USER, PASSWORD), timeout=60) as http:
        token = (await http.get(feed_url)).json()["token"]
        cursor, received = "_first", 0
        start = time.perf_counter()
        while True:
            if version == 2:
                params = {"token": token, "partition": "0", "cursor": cursor}
                response = await http.get(feed_url + "/events", params=params)
            else:
                response = await http.get(feed_url, params={"n": 1, "cursor0": cursor})
            response.raise_for_status()
            events = 0
            for line in response.text.splitlines():
                message = json.loads(line)
                if "data" in message:
                    events += 1
                elif "cursor" in message:
                    cursor = message["cursor"]
            if not events:
                break
            received += events
        elapsed = time.perf_counter() - start
    assert received == expected, f"received {received} of {expected}"
    return expected / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.feed")
    parser.add_argument("--events", type=int, default=200_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-feed-") as tmp:
        db = Path(tmp) / "events.sqlite"
        prepare_futoin_evt_db(db, args.events)
        server, url = start_server(db)
        try:
            feed_url = url.replace("ws", "http", 1).rstrip("/") + "/feed"
            results = {
                "FeedAPI v2, pages of 1000 (events/s)": asyncio.run(
                    read_feed(feed_url, args.events, 2)
                ),
                "ZeroEventHub v1, pages of 1000 (events/s)": asyncio.run(
                    read_feed(feed_url, args.events, 1)
                ),
                "FTN3 poll drain, BlockingClient (events/s)": plain_consumer(
                    url, "POLL", args.events, None
                ),
            }
        finally:
            server.terminate()
            server.wait()
    print_figures(f"{args.events:,} events", results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
