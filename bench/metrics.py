"""``python -m bench.metrics [--source DIR] [--runs N] [--consumers N] [--scrape-only] [--pg URL]``

What metrics cost, on SQLite at ``--durability normal`` (the server's CPU is the limit there,
not fsync):

- the hot path: addEvent calls/s (32 in flight on one connection, and 1 at a time) and the
  server's CPU µs per call, without ``--metrics`` and with it while /metrics is scraped every
  second; ``--source`` runs the server from another tree (the code before metrics, say) too;
- one scrape with ``--consumers`` registered consumers (100,000 events, every consumer
  behind): its time and size at the default ``--metrics-consumers`` and with all reported;
  on PostgreSQL too with ``--pg postgresql://postgres@127.0.0.1:5432/postgres``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psycopg

from futoin_evt.domain.stream import utc_timestamp

from . import postgres, workloads
from .systems import USER, free_port, serve, start_futoin_evt

ADDS = 20_000
SERIAL = 3_000


@contextlib.asynccontextmanager
async def _scraping(url: str | None) -> AsyncIterator[None]:
    """Scrape ``url`` every second meanwhile (nothing when None)."""
    if url is None:
        yield
        return

    async def scrape() -> None:
        async with httpx.AsyncClient(timeout=30) as http:
            while True:
                (await http.get(url)).raise_for_status()
                await asyncio.sleep(1.0)

    task = asyncio.create_task(scrape())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def one_run(source: Path | None, metrics: bool) -> tuple[float, float, float]:
    """(addEvent/s 32 in flight, addEvent/s 1 at a time, server CPU µs per call)."""
    with tempfile.TemporaryDirectory() as workdir:
        port = free_port() if metrics else 0
        extra = ("--metrics", f"127.0.0.1:{port}") if metrics else ()
        system = await start_futoin_evt(Path(workdir), *extra, durability="normal", source=source)
        try:
            url = f"http://127.0.0.1:{port}/metrics" if metrics else None
            async with _scraping(url):
                before = system.cpu_seconds()
                in_flight = await workloads.add_in_flight(system, ADDS)
                cpu = (system.cpu_seconds() - before) / ADDS * 1e6
                serial = await workloads.add_serial(system, SERIAL)
        finally:
            await system.stop()
    return in_flight, serial, cpu


async def hot_path(source: Path | None, runs: int) -> None:
    """The variants take turns, in a rotating order, so that a busy machine (and whatever
    favours the first or the last) hurts them alike."""
    variants: dict[str, tuple[Path | None, bool]] = {"this tree, no --metrics": (None, False)}
    variants["this tree, --metrics, scraped every second"] = (None, True)
    if source is not None:
        variants = {f"{source}, no --metrics": (source, False), **variants}
    results: dict[str, list[tuple[float, float, float]]] = {label: [] for label in variants}
    order = list(variants.items())
    for _ in range(runs):
        for label, (tree, metrics) in order:
            results[label].append(await one_run(tree, metrics))
        order = order[1:] + order[:1]  # whoever ran first runs last next time
    for label, figures in results.items():
        in_flight, serial, cpu = (
            statistics.median(column) for column in zip(*figures, strict=True)
        )
        print(
            f"{label}: addEvent 32 in flight {in_flight:,.0f}/s, 1 at a time {serial:,.0f}/s,"
            f" server CPU {cpu:.1f} µs/call (median of {runs})",
            flush=True,
        )


EVENTS = 100_000
#: Consumers of the default stream's partition (key 0).
REGISTER_SQL = (
    "INSERT INTO consumers (partition_key, user_id, component, position, registered_at,"
    " last_seen_at) VALUES (0, {0}, {0}, {0}, {0}, {0})"
)


def _consumer_rows(user_id: int, consumers: int) -> list[tuple[int, str, int, str, str]]:
    """Positions spread over the events: the first consumer at 0, every one behind."""
    ts = utc_timestamp()
    return [(user_id, f"C{i:05d}", i * EVENTS // consumers, ts, ts) for i in range(consumers)]


def _register_sqlite(db: Path, consumers: int) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        (user_id,) = conn.execute("SELECT id FROM users WHERE name = ?", (USER,)).fetchone()
        conn.execute("BEGIN")
        conn.executemany(REGISTER_SQL.format("?"), _consumer_rows(user_id, consumers))
        conn.execute("COMMIT")
    finally:
        conn.close()


async def _register_pg(url: str, consumers: int) -> None:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cursor = await conn.execute("SELECT id FROM users WHERE name = %s", (USER,))
        row = await cursor.fetchone()
        assert row is not None
        async with conn.cursor() as many:
            await many.executemany(REGISTER_SQL.format("%s"), _consumer_rows(row[0], consumers))
        await conn.commit()


async def scrape_cost(consumers: int, reports: list[int], runs: int, pg: str | None) -> None:
    if pg is None:
        with tempfile.TemporaryDirectory() as workdir:
            # the server prepares the file; the consumers go in while it is stopped
            system = await start_futoin_evt(Path(workdir), prefill=EVENTS)
            await system.stop()
            _register_sqlite(system.db_path, consumers)
            for report in reports:
                await _scrapes("SQLite", str(system.db_path), consumers, report, runs)
        return
    async with postgres.database(pg) as url:
        await postgres.prepare(url, EVENTS)
        await _register_pg(url, consumers)
        for report in reports:
            await _scrapes("PostgreSQL", url, consumers, report, runs)


async def _scrapes(label: str, db: str, consumers: int, report: int, runs: int) -> None:
    port = free_port()
    metrics = ("--metrics", f"127.0.0.1:{port}", "--metrics-consumers", str(report))
    system = await serve(db, *metrics)
    try:
        times: list[float] = []
        reads: list[float] = []
        size = 0
        async with httpx.AsyncClient(timeout=120) as http:
            for _ in range(runs):
                await asyncio.sleep(1.1)  # past the cache: each scrape reads the store
                start = time.perf_counter()
                reply = await http.get(f"http://127.0.0.1:{port}/metrics")
                times.append(time.perf_counter() - start)
                size = len(reply.content)
                read = re.search(r"^futoin_evt_consumers_read_seconds (\S+)$", reply.text, re.M)
                assert read is not None
                reads.append(float(read.group(1)))
    finally:
        await system.stop()
    print(
        f"{label}: one scrape, {consumers:,} consumers, {report:,} reported: "
        f"{statistics.median(times) * 1000:,.0f} ms (median of {runs}), of which the store's "
        f"read {statistics.median(reads) * 1000:,.0f} ms; {size / 1024:,.0f} KiB",
        flush=True,
    )


async def main_async(args: argparse.Namespace) -> None:
    if not args.scrape_only:
        await hot_path(args.source, args.runs)
    reports = [1000, args.consumers]
    await scrape_cost(args.consumers, reports, args.runs, None)
    if args.pg is not None:
        await scrape_cost(args.consumers, reports, args.runs, args.pg)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__)
    parser.add_argument("--source", type=Path, help="also run the server from this tree")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--consumers", type=int, default=10_000)
    parser.add_argument("--scrape-only", action="store_true", help="only the scrape's cost")
    parser.add_argument(
        "--pg", metavar="URL", help="also the scrape on PostgreSQL (a database made and dropped)"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
