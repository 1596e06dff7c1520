"""``python -m bench.partitions [--url URL] [--events N] [--runs R] [--rows ...]``: writes that
grow with partitions and processes.

Rows (each the median of ``--runs``):

- ``add32``: addEvent, 32 in flight on one connection, on SQLite (``events``/0), through a
  ``serve`` process: the workload of ``python -m bench`` (``--source`` runs another tree's
  server, to compare before and after in one sitting);
- ``sqlite``: the store's appends on a SQLite file, 128 in flight, spread over 1 partition
  and over 4 partitions (one writer: one group commit takes them all);
- ``pg``: the store's appends on PostgreSQL to 4 partitions, 128 in flight per process, from
  one process and from two processes each writing its own two partitions;
- ``ordering``: two processes committing 32-row batches into ONE partition's table on
  PostgreSQL, (a) under the partition's advisory lock, as the store does, and (b) without
  it, each row carrying its ``xid8`` for readers that stop at the visibility horizon (the
  design the store does not use: it cannot keep ids in commit order, see
  ``futoin_evt/storage/postgres/store.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import psycopg

from bench import systems, workloads

ROOT: Final = str(Path(__file__).resolve().parent.parent)
DEFAULT_PG: Final = os.environ.get(
    "FUTOIN_EVT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)
IN_FLIGHT: Final = 128

#: One writer process: appends ``count`` events spread over the partitions ``keys`` (numbers
#: 0.. of stream ``bench``) with IN_FLIGHT in flight; waits for "go" on stdin, prints
#: (start, end) wall-clock seconds.
STORE_WRITER: Final = """
import asyncio, json, sys, time
sys.path.insert(0, {root!r})
from futoin_evt.domain.partition import Partition
from futoin_evt.storage import open_store

async def main(db, count, keys):
    async with await open_store(db) as store:
        logs = [store.partition_log(Partition("bench", n, k)) for n, k in enumerate(keys)]
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.time()
        async def worker(w):
            for i in range(w, count, {in_flight}):
                await logs[i % len(logs)].append("BENCH", '{{"n":1}}')
        await asyncio.gather(*(worker(w) for w in range({in_flight})))
        print(json.dumps([start, time.time()]), flush=True)

asyncio.run(main(sys.argv[1], int(sys.argv[2]), [int(k) for k in sys.argv[3].split(",")]))
"""

#: One raw writer: 32-row transactions into one table; mode "lock" or "horizon".
RAW_WRITER: Final = """
import json, sys, time
import psycopg
url, count, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with psycopg.connect(url) as conn:
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    types, datas = ["BENCH"] * 32, ['{"n":1}'] * 32
    for _ in range(0, count, 32):
        with conn.transaction():
            if mode == "lock":
                conn.execute("SELECT pg_advisory_xact_lock(4609103, 1)")
            conn.execute(
                "INSERT INTO ordering (type, data, ts) SELECT t, d, 'x'"
                " FROM unnest(%s::text[], %s::text[]) AS u(t, d) RETURNING id",
                (types, datas),
            ).fetchall()
            conn.execute("SELECT pg_notify('bench', currval('ordering_id_seq')::text)")
    print(json.dumps([start, time.time()]), flush=True)
"""


@asynccontextmanager
async def database(admin_url: str) -> AsyncIterator[str]:
    name = f"futoin_evt_bench_{secrets.token_hex(6)}"
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as admin:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield urlunsplit(urlsplit(admin_url)._replace(path="/" + name))
        finally:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


async def together(commands: list[list[str]], count: int) -> float:
    """Start every writer, let them go at once; total events/s from first start to last end."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, *cmd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
        )
        for cmd in commands
    ]
    for proc in procs:
        assert proc.stdout is not None
        assert (await proc.stdout.readline()).strip() == b"ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
    spans: list[tuple[float, float]] = []
    for proc in procs:
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        start, end = json.loads(out)
        spans.append((float(start), float(end)))
    return count * len(procs) / (max(s[1] for s in spans) - min(s[0] for s in spans))


async def store_rate(db: str, count: int, groups: list[list[int]]) -> float:
    code = STORE_WRITER.format(root=ROOT, in_flight=IN_FLIGHT)
    commands = [["-c", code, db, str(count // len(groups)), ",".join(map(str, g))] for g in groups]
    return await together(commands, count // len(groups))


async def stream_keys(db: str, partitions: int) -> list[int]:
    from futoin_evt.storage import open_store

    async with await open_store(db) as store:
        info = await store.stream("bench") or await store.add_stream("bench", partitions)
        return [p.key for p in info.partitions]


async def add32(args: argparse.Namespace) -> dict[str, float]:
    rates = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
            system = await systems.start_futoin_evt(Path(tmp), source=args.source)
            try:
                rates.append(await workloads.add_in_flight(system, args.events))
            finally:
                await system.stop()
    return {"addEvent, 32 in flight on 1 connection, SQLite events/0 (calls/s)": _median(rates)}


async def sqlite_rows(args: argparse.Namespace) -> dict[str, float]:
    row: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for partitions in (1, 4):
            with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
                db = str(Path(tmp) / "p.sqlite")
                keys = await stream_keys(db, partitions)
                rate = await store_rate(db, args.events, [keys])
                label = f"SQLite store appends, {IN_FLIGHT} in flight, {partitions} partition"
                row.setdefault(label + ("s" if partitions > 1 else "") + " (events/s)", []).append(
                    rate
                )
    return {k: _median(v) for k, v in row.items()}


async def pg_rows(args: argparse.Namespace) -> dict[str, float]:
    row: dict[str, list[float]] = {}
    for _ in range(args.runs):
        async with database(args.url) as url:
            keys = await stream_keys(url, 4)
            one = await store_rate(url, args.events, [keys])
            two = await store_rate(url, args.events, [keys[:2], keys[2:]])
        row.setdefault("PostgreSQL store appends, 4 partitions, 1 process (events/s)", []).append(
            one
        )
        row.setdefault(
            "PostgreSQL store appends, 4 partitions, 2 processes x 2 (events/s)", []
        ).append(two)
    return {k: _median(v) for k, v in row.items()}


async def ordering_rows(args: argparse.Namespace) -> dict[str, float]:
    row: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for mode, label in (
            ("lock", "(a) per-partition advisory lock"),
            ("horizon", "(b) xid8 horizon, no lock"),
        ):
            async with database(args.url) as url:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(
                        "CREATE TABLE ordering (id BIGINT GENERATED ALWAYS AS IDENTITY"
                        " PRIMARY KEY, type TEXT, data TEXT, ts TEXT"
                        + (
                            ", tx xid8 NOT NULL DEFAULT pg_current_xact_id())"
                            if mode == "horizon"
                            else ")"
                        )
                    )
                per = args.events // 2
                commands = [["-c", RAW_WRITER, url, str(per), mode] for _ in range(2)]
                rate = await together(commands, per)
            row.setdefault(
                f"PostgreSQL one partition, 2 processes, 32-row commits, {label} (rows/s)", []
            ).append(rate)
    return {k: _median(v) for k, v in row.items()}


def _median(values: list[float]) -> float:
    return statistics.median(values)


ROWS: Final = {"add32": add32, "sqlite": sqlite_rows, "pg": pg_rows, "ordering": ordering_rows}


async def main_async(args: argparse.Namespace) -> None:
    for name in args.rows:
        started = time.perf_counter()
        for label, value in (await ROWS[name](args)).items():
            print(f"{label}: {value:,.0f}", flush=True)
        print(f"# {name}: {time.perf_counter() - started:.0f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__)
    parser.add_argument("--url", default=DEFAULT_PG, help="PostgreSQL to create databases on")
    parser.add_argument("--events", type=int, default=20_000, help="events per measurement")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--source", type=Path, help="run the add32 server from this tree")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
