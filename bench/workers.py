"""``python -m bench.workers [--count N] [--runs N] [--pg URL]``: ``serve --workers 1``
beside ``--workers 2``, same run, SQLite at ``--durability full`` (or ``normal``), and PostgreSQL
with ``--pg``.

Rows: addEvent with 32 in flight on one connection, addEvent from 8 connections x 4 in
flight, and push latency at 1,000 events/s twice: the producer's connection on the same
worker as the receiver's, and on the other one (the wake-up crosses the workers' channel,
or PostgreSQL's notification channel). Which worker took a connection is read from
``/proc`` (the worker process holding the server side of the socket). The load generator
runs in this one process, on the same cores as the workers.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path
from typing import Final

from . import workloads
from .loadgen import LoadClient
from .postgres import database, prepare
from .systems import System, start_futoin_evt

ADD_32: Final = "addEvent, 32 in flight (calls/s)"
ADD_8: Final = "addEvent, 8 connections x 4 (calls/s)"
SAME_P50: Final = "push latency p50, producer on the same worker (ms)"
SAME_P99: Final = "push latency p99, producer on the same worker (ms)"
OTHER_P50: Final = "push latency p50, producer on the other worker (ms)"
OTHER_P99: Final = "push latency p99, producer on the other worker (ms)"


def _children(pid: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _worker_of(system: System, client: LoadClient) -> int:
    """The pid of the worker serving ``client`` (the supervisor's pid with one process)."""
    transport = client._io.transport
    assert transport is not None
    local_port = transport.get_extra_info("sockname")[1]
    server_port = int(system.url.rstrip("/").rsplit(":", 1)[1])
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if (
            int(fields[1].split(":")[1], 16) == server_port
            and int(fields[2].split(":")[1], 16) == local_port
        ):
            inode = fields[9]
    target = f"socket:[{inode}]"
    for pid in _children(system.process.pid) or [system.process.pid]:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if fd.readlink().as_posix() == target:
                    return pid
            except OSError:
                continue
    raise RuntimeError("no worker holds the connection")


async def _pair(system: System, same: bool) -> tuple[LoadClient, LoadClient]:
    """A receiver and a producer connection on the same worker, or on different ones."""
    receiver = await workloads.connect(system)
    where = _worker_of(system, receiver)
    for _ in range(100):
        producer = await workloads.connect(system)
        if (_worker_of(system, producer) == where) == same:
            return receiver, producer
        await producer.close()
    raise RuntimeError("no connection landed where wanted")


async def _latency(system: System, count: int, same: bool) -> dict[str, float]:
    receiver, producer = await _pair(system, same)
    try:
        return await workloads.push_latency_on(receiver, producer, count)
    finally:
        await receiver.close()
        await producer.close()


async def _run(
    db: str, workers: int, count: int, workdir: Path, durability: str
) -> dict[str, float]:
    options: tuple[str, ...] = ("--workers", str(workers))
    if db:
        options += ("--db", db)
    system = await start_futoin_evt(workdir, *options, durability=durability)
    try:
        figures = {
            ADD_32: await workloads.add_in_flight(system, count),
            ADD_8: await workloads.add_from_connections(system, count),
        }
        same = await _latency(system, 2000, same=True)
        figures[SAME_P50], figures[SAME_P99] = same["p50"], same["p99"]
        if workers > 1:
            other = await _latency(system, 2000, same=False)
            figures[OTHER_P50], figures[OTHER_P99] = other["p50"], other["p99"]
        return figures
    finally:
        await system.stop()


async def main_async(args: argparse.Namespace) -> None:
    await _compare("sqlite", "", args)
    if args.pg:
        async with database(args.pg) as url:
            await prepare(url, 0)
            await _compare("pg", url, args)


async def _compare(name: str, db: str, args: argparse.Namespace) -> None:
    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for _ in range(args.runs):
        for workers in (1, 2):
            with tempfile.TemporaryDirectory() as workdir:
                run = await _run(db, workers, args.count, Path(workdir), args.durability)
                results[workers].append(run)
    print(f"\n{name}, median of {args.runs}: --workers 1 / --workers 2")
    for row in results[2][0]:
        one = [r[row] for r in results[1] if row in r]
        two = statistics.median(r[row] for r in results[2])
        first = f"{statistics.median(one):>10,.1f}" if one else f"{'':>10}"
        print(f"{row:<55} {first} {two:>10,.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__)
    parser.add_argument("--count", type=int, default=20_000, help="addEvent calls per row")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--durability", choices=["full", "normal"], default="full")
    parser.add_argument("--pg", metavar="URL", help="also on a new database on this server")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
