"""``python -m bench.postgres [--quick] [--url URL]``: futoin-evt on PostgreSQL beside SQLite.

Each run gets a new database with a random name on the PostgreSQL that ``--url`` (default
``$FUTOIN_EVT_TEST_PG`` or 127.0.0.1:5432 as postgres) names, dropped afterwards. Rows:

- addEvent, 1 at a time and 32 in flight on one connection, one server process;
- poll drain and push catch-up of a prefilled backlog;
- addEvent from two producer processes (32 in flight each) against one server process and
  against two server processes on the same database (how far a second process scales);
- push latency across processes: added through process A, pushed by process B;
- the raw limit: batched INSERTs of 32 rows per transaction through psycopg, one connection.

The SQLite column runs the same workloads on a file (one process: SQLite has no second).
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
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import psycopg

from futoin_evt.auth.users import hash_password
from futoin_evt.domain.rights import Right
from futoin_evt.storage import open_store

from . import workloads
from .systems import PASSWORD, USER, System, prefill_rows, serve, start_futoin_evt

ROOT: Final = str(Path(__file__).resolve().parent.parent)
RESULTS: Final = Path(__file__).resolve().parent / "results" / "postgres.json"
DEFAULT_PG: Final = "postgresql://postgres@127.0.0.1:5432/postgres"
PRODUCER: Final = """
import asyncio, json, sys
sys.path.insert(0, {root!r})
from bench import workloads
class Target:
    url = {url!r}
    credentials = {credentials!r}
    name = "futoin-evt"
print(json.dumps(asyncio.run(workloads.add_in_flight(Target(), {adds}))))
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


async def prepare(url: str, prefill: int) -> None:
    async with await open_store(url) as store:
        user = await store.add_user(USER, hash_password(PASSWORD))
        await store.grant(user, "*", int(Right.READ | Right.WRITE))
    async with await psycopg.AsyncConnection.connect(url) as conn:
        async with (
            conn.cursor() as cursor,
            cursor.copy("COPY events (type, data, ts, checksum) FROM STDIN") as copy,
        ):
            for row in prefill_rows(prefill):
                await copy.write_row(row)
        await conn.commit()


async def start_servers(url: str, count: int, *extra: str) -> list[System]:
    """``extra``: more ``serve`` options (``--amqp 127.0.0.1:0``, say). The servers of one
    database share an AMQP SAS secret in the temporary directory (not the working one)."""
    if "--sas-secret" not in extra:
        secret = Path(tempfile.gettempdir()) / f"futoin-evt-bench-{url.rsplit('/', 1)[-1]}"
        extra = (*extra, "--sas-secret", str(secret.with_suffix(".sas-secret")))
    return [await serve(url, *extra, name="futoin-evt pg") for _ in range(count)]


@dataclass
class PostgresSystem(System):
    """A futoin-evt server on a database of its own, dropped when the server stops."""

    drop: Callable[[], Awaitable[None]] | None = None
    #: The database's URL (``--db`` of the other commands).
    db_url: str = ""

    async def stop(self) -> None:
        await super().stop()
        if self.drop is not None:
            await self.drop()


async def start_futoin_evt_pg(
    workdir: Path, *extra: str, prefill: int = 0, admin_url: str | None = None
) -> PostgresSystem:
    """For ``python -m bench``: one server process on a new PostgreSQL database on
    ``admin_url``'s server (default ``$FUTOIN_EVT_TEST_PG`` or :data:`DEFAULT_PG`)."""
    del workdir  # the data lives in PostgreSQL
    admin_url = admin_url or os.environ.get("FUTOIN_EVT_TEST_PG", DEFAULT_PG)
    owner = database(admin_url)
    url = await owner.__aenter__()
    try:
        await prepare(url, prefill)
        (server,) = await start_servers(url, 1, *extra)
    except BaseException:
        await owner.__aexit__(None, None, None)
        raise

    async def drop() -> None:
        await owner.__aexit__(None, None, None)

    started = {field.name: getattr(server, field.name) for field in fields(System)}
    return PostgresSystem(**started, drop=drop, db_url=url)


async def producers(targets: list[System], adds: int) -> float:
    """Total addEvent calls/s of one producer process per target (32 in flight each)."""
    procs = []
    for t in targets:
        code = PRODUCER.format(root=ROOT, url=t.url, credentials=t.credentials, adds=adds)
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE
            )
        )
    outs = await asyncio.gather(*(p.communicate() for p in procs))
    return sum(float(json.loads(out)) for out, _err in outs)


async def raw_limit(url: str, count: int, batch: int = 32) -> float:
    """Rows/s of multi-row INSERTs, ``batch`` rows per transaction, one connection."""
    rows = prefill_rows(count)
    async with await psycopg.AsyncConnection.connect(url) as conn:
        await conn.execute("CREATE TABLE raw_events (id BIGSERIAL PRIMARY KEY, type TEXT,"
                           " data TEXT, ts TEXT)")  # fmt: skip
        await conn.commit()
        start = time.perf_counter()
        for first in range(0, count, batch):
            chunk = rows[first : first + batch]
            await conn.execute(
                "INSERT INTO raw_events (type, data, ts)"
                " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[])",
                ([r[0] for r in chunk], [r[1] for r in chunk], [r[2] for r in chunk]),
            )
            await conn.commit()
        return count / (time.perf_counter() - start)


async def measure_pg(admin_url: str, sizes: dict[str, int]) -> dict[str, float]:
    row: dict[str, float] = {}
    async with database(admin_url) as url:
        await prepare(url, sizes["drain"])
        servers = await start_servers(url, 2)
        one, two = servers
        try:
            row["poll drain (events/s)"] = await workloads.poll_drain(one, sizes["drain"])
            row["push catch-up (events/s)"] = await workloads.push_catch_up(one, sizes["drain"])
            row["addEvent, 1 at a time (calls/s)"] = await workloads.add_serial(
                one, sizes["serial"]
            )
            row["addEvent, 32 in flight (calls/s)"] = await workloads.add_in_flight(
                one, sizes["in_flight"]
            )
            row["addEvent, 2 producers, 1 process (calls/s)"] = await producers(
                [one, one], sizes["in_flight"]
            )
            row["addEvent, 2 producers, 2 processes (calls/s)"] = await producers(
                [one, two], sizes["in_flight"]
            )
            # added through one process, pushed by the other (LISTEN/NOTIFY wakes it)
            latency = await workloads.push_latency(two, sizes["latency"], add_to=one)
            row["push latency across processes, 1,000/s p50 (ms)"] = latency["p50"]
            row["push latency across processes, 1,000/s p99 (ms)"] = latency["p99"]
        finally:
            for server in servers:
                await server.stop()
        row["raw limit: 32-row INSERTs (rows/s)"] = await raw_limit(url, sizes["in_flight"])
    return row


async def measure_sqlite(sizes: dict[str, int]) -> dict[str, float]:
    row: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        system = await start_futoin_evt(Path(tmp), prefill=sizes["drain"])
        try:
            row["poll drain (events/s)"] = await workloads.poll_drain(system, sizes["drain"])
            row["push catch-up (events/s)"] = await workloads.push_catch_up(system, sizes["drain"])
            row["addEvent, 1 at a time (calls/s)"] = await workloads.add_serial(
                system, sizes["serial"]
            )
            row["addEvent, 32 in flight (calls/s)"] = await workloads.add_in_flight(
                system, sizes["in_flight"]
            )
            row["addEvent, 2 producers, 1 process (calls/s)"] = await producers(
                [system, system], sizes["in_flight"]
            )
        finally:
            await system.stop()
    return row


async def main_async(args: argparse.Namespace) -> None:
    sizes = (
        {"drain": 10_000, "serial": 300, "in_flight": 3_000, "latency": 300}
        if args.quick
        else {"drain": 100_000, "serial": 3_000, "in_flight": 30_000, "latency": 3_000}
    )
    runs = 1 if args.quick else args.runs
    pg: dict[str, list[float]] = {}
    lite: dict[str, list[float]] = {}
    for _ in range(runs):
        for name, value in (await measure_pg(args.url, sizes)).items():
            pg.setdefault(name, []).append(value)
        for name, value in (await measure_sqlite(sizes)).items():
            lite.setdefault(name, []).append(value)
    width = max(len(name) for name in pg)
    print(f"{'workload'.ljust(width)} | {'PostgreSQL':>10} | {'SQLite':>10}")
    for name, values in pg.items():
        ours = statistics.median(values)
        other = statistics.median(lite[name]) if name in lite else None
        digits = 1 if "(ms)" in name else 0
        cell = f"{other:,.{digits}f}" if other is not None else "-"
        print(f"{name.ljust(width)} | {ours:>10,.{digits}f} | {cell:>10}")
    report: dict[str, Any] = {"sizes": sizes, "runs": runs, "postgres": pg, "sqlite": lite}
    _write_report(report)


def _write_report(report: dict[str, Any]) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, one run")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--url", default=os.environ.get("FUTOIN_EVT_TEST_PG", DEFAULT_PG))
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
