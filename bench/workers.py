"""``python -m bench.workers [--count N] [--runs N] [--pg URL] [--no-jetstream]``:
``serve --workers 1`` beside ``--workers 2`` and NATS JetStream, same run, SQLite at
``--durability full`` (or ``normal``), and PostgreSQL with ``--pg``.

Rows: addEvent one at a time, with 32 in flight on one connection, and from 8 connections x
4 in flight (with the server's CPU µs per call: the supervisor's and every worker's), and
push latency at 1,000 events/s twice: the producer's connection on the same worker as the
receiver's, and on the other one (the wake-up crosses the workers' channel, or PostgreSQL's
notification channel). Which worker took a connection is read from ``/proc`` (the worker
process holding the server side of the socket). JetStream (the machine's server, file
storage, its default durability: equal to ``--durability normal``) runs the same rows in the
same run, each sitting after the futoin-evt ones. The load generator runs in this one
process, on the same cores as the servers.

Under each table, the worker count ``serve`` takes without ``--workers`` on that backend
(:func:`futoin_evt.cli.serve.default_workers`, chosen by these rows), and each row where
that default was the slower column in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from futoin_evt.cli.serve import default_workers

from . import others, workloads
from .loadgen import LoadClient
from .postgres import database, prepare
from .systems import System, children, start_futoin_evt

ADD_1: Final = "addEvent, 1 in flight (calls/s)"
ADD_32: Final = "addEvent, 32 in flight (calls/s)"
ADD_8: Final = "addEvent, 8 connections x 4 (calls/s)"
CPU_1: Final = "  server CPU µs per call, 1 in flight"
CPU_32: Final = "  server CPU µs per call, 32 in flight"
CPU_8: Final = "  server CPU µs per call, 8 x 4"
SAME_P50: Final = "push latency p50, producer on the same worker (ms)"
SAME_P99: Final = "push latency p99, producer on the same worker (ms)"
OTHER_P50: Final = "push latency p50, producer on the other worker (ms)"
OTHER_P99: Final = "push latency p99, producer on the other worker (ms)"


async def _timed(
    figures: dict[str, float], row: str, cpu_row: str, cpu: Callable[[], float],
    work: Awaitable[float], calls: int,
) -> None:  # fmt: skip
    """``figures[row]``: what ``work`` returns; ``figures[cpu_row]``: server CPU µs per call."""
    before = cpu()
    figures[row] = await work
    figures[cpu_row] = (cpu() - before) * 1e6 / calls


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
    for pid in children(system.process.pid) or [system.process.pid]:
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
    cpu = system.cpu_seconds
    try:
        figures: dict[str, float] = {}
        serial = max(count // 10, 100)
        await _timed(figures, ADD_1, CPU_1, cpu, workloads.add_serial(system, serial), serial)
        await _timed(figures, ADD_32, CPU_32, cpu, workloads.add_in_flight(system, count), count)
        add_8 = workloads.add_from_connections(system, count)
        await _timed(figures, ADD_8, CPU_8, cpu, add_8, count)
        same = await _latency(system, 2000, same=True)
        figures[SAME_P50], figures[SAME_P99] = same["p50"], same["p99"]
        if workers > 1:
            other = await _latency(system, 2000, same=False)
            figures[OTHER_P50], figures[OTHER_P99] = other["p50"], other["p99"]
        return figures
    finally:
        await system.stop()


async def _jetstream(count: int) -> dict[str, float]:
    """The same rows on JetStream (CPU: the nats-server process)."""
    target = others.JetStream()
    figures: dict[str, float] = {}
    serial = max(count // 10, 100)
    cpu = target.cpu_seconds
    await _timed(figures, ADD_1, CPU_1, cpu, target.add_serial(serial), serial)
    await _timed(figures, ADD_32, CPU_32, cpu, target.add_in_flight(count), count)
    await _timed(figures, ADD_8, CPU_8, cpu, target.add_from_connections(count), count)
    latency = await target.push_latency(2000)
    figures[SAME_P50], figures[SAME_P99] = latency["p50"], latency["p99"]
    return figures


async def main_async(args: argparse.Namespace) -> None:
    if not args.no_jetstream:
        others.ensure_nats()
    await _compare("sqlite", "", args)
    if args.pg:
        async with database(args.pg) as url:
            await prepare(url, 0)
            await _compare("pg", url, args)


#: Columns: futoin-evt with 1 and 2 workers, JetStream.
JS: Final = 0


async def _compare(name: str, db: str, args: argparse.Namespace) -> None:
    results: dict[int, list[dict[str, float]]] = {1: [], 2: [], JS: []}
    before = " ".join(f"{x:.2f}" for x in os.getloadavg())
    for _ in range(args.runs):
        for workers in (1, 2):
            with tempfile.TemporaryDirectory() as workdir:
                run = await _run(db, workers, args.count, Path(workdir), args.durability)
                results[workers].append(run)
        if not args.no_jetstream:
            results[JS].append(await _jetstream(args.count))
    after = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\n{name} ({args.durability}), median of {args.runs}, load average {before} -> {after}")
    print(f"{'':<55} {'1 worker':>10} {'2 workers':>10} {'JetStream':>10} {'1/JS':>6} {'2/JS':>6}")
    for row in results[2][0]:
        cells = []
        medians: dict[int, float] = {}
        for column in (1, 2, JS):
            values = [r[row] for r in results[column] if row in r]
            if values:
                medians[column] = statistics.median(values)
                cells.append(f"{medians[column]:>10,.1f}")
            else:
                cells.append(f"{'':>10}")
        for column in (1, 2):
            if column in medians and medians.get(JS):
                factor = medians[column] / medians[JS]
                lower_better = "ms" in row or "µs" in row
                cells.append(f"{(1 / factor if lower_better else factor):>5.2f}x")
        print(f"{row:<55} {' '.join(cells)}")
    _check_default(db, results)


def _check_default(db: str, results: dict[int, list[dict[str, float]]]) -> None:
    """Say which column is the default and where it was the slower choice in this run."""
    default = default_workers(db or "futoin-evt.sqlite")
    print(f"default without --workers: {default} (this machine: {os.cpu_count()} cores)")
    if default not in (1, 2):
        return
    other = 3 - default
    for row in results[default][0]:
        if row.startswith(" ") or "p50" in row or row not in results[other][0]:
            continue  # CPU rows follow their rate; p50 stands with its p99
        mine, theirs = (statistics.median(r[row] for r in results[c]) for c in (default, other))
        if (mine > theirs) if "ms" in row else (mine < theirs):
            print(f"  the default was slower: {row}: {mine:,.1f} against {theirs:,.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.workers", description=__doc__)
    parser.add_argument("--count", type=int, default=20_000, help="addEvent calls per row")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--durability", choices=["full", "normal"], default="full")
    parser.add_argument("--pg", metavar="URL", help="also on a new database on this server")
    parser.add_argument("--no-jetstream", action="store_true", help="futoin-evt alone")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
