"""``python -m bench.partitions [--url URL] [--events N] [--runs R] [--rows ...]``: writes to a
stream of 4 partitions, from one process and from two, beside the raw limit.

Row sets (each figure the median of ``--runs``; in one run the rows of a set go one after the
other, so they are compared side by side):

- ``store``: the store's appends, 32 in flight per writer process (spread over its
  partitions, as producers on those partitions would be): SQLite with 1 and with 4
  partitions (one process: one writer takes them all); PostgreSQL with 4 partitions from one
  process, and from two processes each writing its own two; beside them the raw limit,
  32-row ``INSERT`` + ``COMMIT`` through psycopg on one connection per process, round the
  same tables (no lock, no NOTIFY: the database's own pace);
- ``door``: the same through the FTN18 door: ``addEvent``, 32 in flight per producer
  process over one connection per partition (``ws://HOST:PORT/bench/P``), against one
  ``serve`` process (SQLite; PostgreSQL) and against two on one PostgreSQL database, each
  producer with its server and its two partitions. A row counts only when the events landed
  in the partitions it names (checked after the run); a server that does not serve the
  partitions' URLs gives no figure;
- ``add32``: addEvent, 32 in flight on one connection, on SQLite ``events``/0 (``--source``
  runs another tree's server, to compare before and after in one sitting);
- ``ordering``: the two append schemes on raw SQL, two processes of 32-row commits into ONE
  partition's table on PostgreSQL: (a) under the partition's advisory lock, as the store
  does, (b) without it, each row carrying its ``xid8`` for readers that stop at the
  visibility horizon (the design the store does not use: it cannot keep ids in commit
  order, see ``futoin_evt/storage/postgres/store.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import psycopg

from bench import systems, workloads
from bench.postgres import DEFAULT_PG, database

ROOT: Final = str(Path(__file__).resolve().parent.parent)
IN_FLIGHT: Final = 32
PARTITIONS: Final = 4
STREAM: Final = "bench"

SQLITE_1: Final = "store appends, 32 in flight, SQLite, 1 partition (events/s)"
SQLITE_4: Final = "store appends, 32 in flight, SQLite, 4 partitions (events/s)"
PG_1: Final = "store appends, 32 in flight, PostgreSQL, 4 partitions, 1 process (events/s)"
PG_2: Final = (
    "store appends, 32 in flight each, PostgreSQL, 4 partitions, 2 processes x 2 (events/s)"
)
RAW_1: Final = "raw limit: 32-row INSERT + COMMIT, 1 connection round 4 tables (rows/s)"
RAW_2: Final = "raw limit: 32-row INSERT + COMMIT, 2 processes x 2 tables (rows/s)"
DOOR_SQLITE: Final = "addEvent, 32 in flight, SQLite, 4 partitions, 1 server (calls/s)"
DOOR_PG_1: Final = "addEvent, 32 in flight, PostgreSQL, 4 partitions, 1 server (calls/s)"
DOOR_PG_2: Final = "addEvent, 32 in flight each, PostgreSQL, 4 partitions, 2 servers x 2 (calls/s)"

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

#: One raw writer: 32-row commits round the tables it is given (comma-separated), each one
#: statement on an autocommit connection, as the store commits. Mode "plain": the rows alone
#: (the raw limit); "lock": the table's advisory lock first and a NOTIFY of the newest id, as
#: the store does; "horizon": no lock, the rows carry their transaction's xid8 (a column
#: default) for readers that stop at the visibility horizon, and the NOTIFY; "combined": ONE
#: statement for every table, each under its try-lock (a table whose lock is taken gets no
#: rows), ``batch / tables`` rows each, a NOTIFY per table. ``batch`` (default 32): rows per
#: commit.
RAW_WRITER: Final = """
import json, sys, time
import psycopg
url, count, mode, tables = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split(",")
batch = int(sys.argv[5]) if len(sys.argv) > 5 else 32
rows = "SELECT t, d, 'x' FROM unnest(%s::text[], %s::text[]) AS u(t, d)"
def statement(table):
    if mode == "lock":
        return ("WITH locked AS MATERIALIZED (SELECT pg_advisory_xact_lock(4609103,"
                f" {len(table)})), added AS (INSERT INTO {table} (type, data, ts) {rows}, locked"
                " RETURNING id) SELECT array_agg(id), pg_notify('bench', MAX(id)::text) FROM added")
    if mode == "horizon":
        return (f"WITH added AS (INSERT INTO {table} (type, data, ts) {rows} RETURNING id)"
                " SELECT array_agg(id), pg_notify('bench', MAX(id)::text) FROM added")
    return f"INSERT INTO {table} (type, data, ts) {rows}"
def combined():
    locks = ", ".join(
        f"pg_try_advisory_xact_lock(4609103, {n}) AS g{n}" for n in range(len(tables))
    )
    parts = [f"WITH locked AS MATERIALIZED (SELECT {locks})"]
    for n, table in enumerate(tables):
        parts.append(f", a{n} AS (INSERT INTO {table} (type, data, ts) SELECT t, d, 'x'"
                     f" FROM locked, unnest(%s::text[], %s::text[]) AS u(t, d) WHERE g{n}"
                     " RETURNING id)")
    result = ", ".join(f"(SELECT array_agg(id) FROM a{n}), (SELECT pg_notify('bench',"
                       f" MAX(id)::text) FROM a{n})" for n in range(len(tables)))
    return "".join(parts) + " SELECT " + result
with psycopg.connect(url, autocommit=True) as conn:
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    each = batch // len(tables) if mode == "combined" else batch
    types, datas = ["BENCH"] * each, ['{"n":1}'] * each
    if mode == "combined":
        sql, params = combined(), [types, datas] * len(tables)
    for n in range(0, count, batch):
        if mode == "combined":
            conn.execute(sql, params)
        else:
            conn.execute(statement(tables[n // batch % len(tables)]), (types, datas))
    print(json.dumps([start, time.time()]), flush=True)
"""

#: One producer process: ``count`` addEvent calls, IN_FLIGHT in flight over one connection
#: per URL (comma-separated), each call on the connection of its worker.
DOOR_WRITER: Final = """
import asyncio, json, sys, time
sys.path.insert(0, {root!r})
from bench.loadgen import LoadClient
from bench.workloads import GEN, add_params

async def main(urls, credentials, count):
    clients = [await LoadClient.connect(url, credentials) for url in urls]
    for client in clients:
        await client.call(f"{{GEN}}:addEvent", '{{"type":"WARMUP","data":null}}')
    params = add_params(count)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = time.time()
    async def worker(w):
        client = clients[w % len(clients)]
        for p in params[w::{in_flight}]:
            await client.call(f"{{GEN}}:addEvent", p)
    await asyncio.gather(*(worker(w) for w in range({in_flight})))
    print(json.dumps([start, time.time()]), flush=True)

asyncio.run(main(sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])))
"""


async def together(commands: list[list[str]], count: int) -> float:
    """Start every writer, let them go at once; total events/s from first start to last end
    (``count`` events each)."""
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


async def store_rate(db: str, count: int, groups: list[list[int]], root: str = ROOT) -> float:
    """Events/s of one store writer process per group of partition keys (the store of the
    tree ``root``)."""
    code = STORE_WRITER.format(root=root, in_flight=IN_FLIGHT)
    per = count // len(groups)
    commands = [["-c", code, db, str(per), ",".join(map(str, g))] for g in groups]
    return await together(commands, per)


async def raw_rate(
    url: str, count: int, groups: list[list[str]], mode: str = "plain", batch: int = 32
) -> float:
    """Rows/s of one raw writer process per group of tables, ``batch`` rows per commit."""
    per = count // len(groups)
    commands = [["-c", RAW_WRITER, url, str(per), mode, ",".join(g), str(batch)] for g in groups]
    return await together(commands, per)


async def door_rate(
    servers: list[str], credentials: str, count: int, groups: list[list[int]]
) -> float:
    """addEvent calls/s of one producer process per server, each writing the partitions of
    its group (numbers of stream ``bench``) on connections of their own."""
    code = DOOR_WRITER.format(root=ROOT, in_flight=IN_FLIGHT)
    per = count // len(groups)
    commands = [
        ["-c", code, ",".join(f"{server.rstrip('/')}/{STREAM}/{n}" for n in group),
         credentials, str(per)]
        for server, group in zip(servers, groups, strict=True)
    ]  # fmt: skip
    return await together(commands, per)


async def stream_keys(db: str, partitions: int) -> list[int]:
    """The keys of stream ``bench`` (added with ``partitions`` when it is not there)."""
    from futoin_evt.storage import open_store

    async with await open_store(db) as store:
        info = await store.stream(STREAM) or await store.add_stream(STREAM, partitions)
        return [p.key for p in info.partitions]


async def heads(db: str) -> list[int]:
    """The newest id of each partition of stream ``bench``."""
    from futoin_evt.storage import open_store

    async with await open_store(db) as store:
        info = await store.stream(STREAM)
        assert info is not None
        return [await store.partition_log(p).newest_event_id() for p in info.partitions]


async def create_raw_tables(url: str, count: int) -> list[str]:
    names = [f"raw_{n}" for n in range(count)]
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        for name in names:
            await conn.execute(
                f"CREATE TABLE {name} (id BIGSERIAL PRIMARY KEY, type TEXT, data TEXT, ts TEXT)"
            )
    return names


Rows = dict[str, list[float]]


async def store_rows(
    admin_url: str | None, events: int, runs: int, source: Path | None = None
) -> Rows:
    """The ``store`` set (PostgreSQL's rows only with ``admin_url``); with ``source``, each
    PostgreSQL store row also for that tree's store, right before this one's ("before: ")."""
    row: Rows = {}
    for _ in range(runs):
        for partitions, label in ((1, SQLITE_1), (PARTITIONS, SQLITE_4)):
            with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
                db = str(Path(tmp) / "p.sqlite")
                keys = await stream_keys(db, partitions)
                row.setdefault(label, []).append(await store_rate(db, events, [keys]))
        if admin_url is None:
            continue
        async with database(admin_url) as url:
            keys = await stream_keys(url, PARTITIONS)
            tables = await create_raw_tables(url, PARTITIONS)
            for root, prefix in ((source, "before: "), (ROOT, "")):
                if root is None:
                    continue
                one = await store_rate(url, events, [keys], str(root))
                row.setdefault(prefix + PG_1, []).append(one)
                two = await store_rate(url, events, [keys[:2], keys[2:]], str(root))
                row.setdefault(prefix + PG_2, []).append(two)
            row.setdefault(RAW_1, []).append(await raw_rate(url, events, [tables]))
            row.setdefault(RAW_2, []).append(await raw_rate(url, events, [tables[:2], tables[2:]]))
    return row


async def serves_partitions(server: str, credentials: str, db: str) -> bool:
    """Whether an addEvent on ``/bench/0`` of ``server`` lands in that partition."""
    from bench.loadgen import LoadClient

    try:
        client = await LoadClient.connect(f"{server.rstrip('/')}/{STREAM}/0", credentials)
        try:
            await client.call(f"{workloads.GEN}:addEvent", '{"type":"PROBE","data":null}')
        finally:
            await client.close()
    except Exception:
        return False
    return (await heads(db))[0] > 0


async def door_rows(admin_url: str | None, events: int, runs: int) -> Rows:
    """The ``door`` set; a row whose events did not land in its partitions is left out, and
    the set is skipped at once when the server does not serve the partitions' URLs."""
    from bench import postgres

    row: Rows = {}
    credentials = f"{systems.USER}:{systems.PASSWORD}"
    everyone = [list(range(PARTITIONS))]
    halves = [list(range(PARTITIONS // 2)), list(range(PARTITIONS // 2, PARTITIONS))]
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
            # the stream is there before the server starts: served from its first call
            system = await systems.start_futoin_evt(Path(tmp), streams={STREAM: PARTITIONS})
            try:
                if not await serves_partitions(system.url, credentials, str(system.db_path)):
                    print(f"# the server does not serve /{STREAM}/P: no addEvent rows")
                    return row
                await _served(row, DOOR_SQLITE, str(system.db_path), events, 0,
                              door_rate([system.url], credentials, events, everyone))  # fmt: skip
            finally:
                await system.stop()
        if admin_url is None:
            continue
        async with database(admin_url) as url:
            await postgres.prepare(url, 0)
            await stream_keys(url, PARTITIONS)
            servers = await postgres.start_servers(url, 2)
            try:
                urls = [s.url for s in servers]
                await _served(row, DOOR_PG_1, url, events, 0,
                              door_rate(urls[:1], credentials, events, everyone))  # fmt: skip
                await _served(row, DOOR_PG_2, url, events, events // PARTITIONS,
                              door_rate(urls, credentials, events, halves))  # fmt: skip
            finally:
                for server in servers:
                    await server.stop()
    return row


async def _served(
    row: Rows, label: str, db: str, events: int, before: int, rate: Awaitable[float]
) -> None:
    """Record the rate under ``label`` when every partition got its share of the events."""
    figure = await rate
    got = await heads(db)
    # each partition: its share, plus the warm-up call of each connection
    if all(head - before >= events // PARTITIONS for head in got):
        row.setdefault(label, []).append(figure)
    else:
        print(f"# {label}: not served (partition heads {got}); no figure", flush=True)


async def add32_rows(events: int, runs: int, source: Path | None) -> Rows:
    rates = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="bench-partitions-") as tmp:
            system = await systems.start_futoin_evt(Path(tmp), source=source)
            try:
                rates.append(await workloads.add_in_flight(system, events))
            finally:
                await system.stop()
    return {"addEvent, 32 in flight on 1 connection, SQLite events/0 (calls/s)": rates}


async def ordering_rows(admin_url: str, events: int, runs: int) -> Rows:
    row: Rows = {}
    for _ in range(runs):
        for mode, label in (
            ("lock", "(a) per-partition advisory lock"),
            ("horizon", "(b) xid8 horizon, no lock"),
        ):
            async with database(admin_url) as url:
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
                rate = await raw_rate(url, events, [["ordering"], ["ordering"]], mode)
            row.setdefault(
                f"PostgreSQL one partition, 2 processes, 32-row commits, {label} (rows/s)", []
            ).append(rate)
    return row


async def commit_rows(admin_url: str, events: int, runs: int) -> Rows:
    """32 rows in flight over 4 partitions' tables on PostgreSQL, each under its partition's
    lock, with a NOTIFY: (a) a commit per partition (8 rows each, 4 connections, as the
    store commits today), (b) one commit for the 4 (one connection, a try-lock each)."""
    row: Rows = {}
    for _ in range(runs):
        async with database(admin_url) as url:
            tables = await create_raw_tables(url, PARTITIONS)
            apart = await raw_rate(url, events, [[t] for t in tables], "lock", IN_FLIGHT // 4)
            one = await raw_rate(url, events, [tables], "combined", IN_FLIGHT)
        label = "PostgreSQL 4 partitions, 32 in flight, locks and NOTIFY"
        row.setdefault(f"{label}: (a) a commit per partition (rows/s)", []).append(apart)
        row.setdefault(f"{label}: (b) one commit for all 4 (rows/s)", []).append(one)
    return row


def medians(rows: Rows) -> dict[str, float]:
    return {k: statistics.median(v) for k, v in rows.items()}


#: The ratios the issue sets targets for: (label, row, over row, target).
RATIOS: Final = (
    ("PostgreSQL store, 2 processes / 1", PG_2, PG_1, 1.6),
    ("PostgreSQL store, 1 process / raw limit", PG_1, RAW_1, 0.5),
    ("SQLite store, 4 partitions / 1", SQLITE_4, SQLITE_1, 1.0),
    ("PostgreSQL addEvent, 2 servers / 1", DOOR_PG_2, DOOR_PG_1, 1.6),
    ("PostgreSQL addEvent, 1 server / raw limit", DOOR_PG_1, RAW_1, 0.5),
)


def ratios(table: dict[str, float]) -> dict[str, float]:
    """Each of :data:`RATIOS` whose rows were measured."""
    return {
        label: table[row] / table[over]
        for label, row, over, _target in RATIOS
        if table.get(row) and table.get(over)
    }


#: What ``python -m bench --quick`` (CI) must reach of :data:`RATIOS`, by label: half of the
#: lowest ratio seen on this shared machine (README, Benchmarks), so noise passes and a
#: slowdown by half fails.
FLOORS: Final = {
    "PostgreSQL store, 2 processes / 1": 0.55,
    "PostgreSQL store, 1 process / raw limit": 0.2,
    "SQLite store, 4 partitions / 1": 0.2,
}


async def measure(admin_url: str | None, events: int, runs: int) -> dict[str, float]:
    """The ``store`` and ``door`` sets for ``python -m bench``: their medians."""
    rows = await store_rows(admin_url, events, runs)
    rows.update(await door_rows(admin_url, events, runs))
    return medians(rows)


def report(table: dict[str, float]) -> list[str]:
    """Print the rows and each ratio with its target and floor; return the ratios below
    their floor."""
    width = max(map(len, table), default=0)
    for label, value in table.items():
        print(f"{label:<{width}}  {value:>10,.0f}")
    missed = []
    targets = {label: target for label, _row, _over, target in RATIOS}
    for label, value in ratios(table).items():
        floor = FLOORS.get(label)
        verdict = "" if floor is None else " ok" if value >= floor else " BELOW THE FLOOR"
        print(f"# {label}: {value:.2f}x (target {targets[label]}x, floor {floor}x){verdict}")
        if floor is not None and value < floor:
            missed.append(f"{label}: {value:.2f}x, floor {floor}x")
    return missed


Measure = Callable[[argparse.Namespace], Awaitable[Rows]]
ROWS: Final[dict[str, Measure]] = {
    "store": lambda a: store_rows(a.url, a.events, a.runs, a.source),
    "door": lambda a: door_rows(a.url, a.events, a.runs),
    "add32": lambda a: add32_rows(a.events, a.runs, a.source),
    "ordering": lambda a: ordering_rows(a.url, a.events, a.runs),
    "commits": lambda a: commit_rows(a.url, a.events, a.runs),
}


async def main_async(args: argparse.Namespace) -> None:
    table: dict[str, float] = {}
    for name in args.rows:
        started = time.perf_counter()
        measured = await ROWS[name](args)
        for label, values in measured.items():
            each = ", ".join(f"{v:,.0f}" for v in values)
            print(f"{label}: {statistics.median(values):,.0f} ({each})", flush=True)
        table.update(medians(measured))
        print(f"# {name}: {time.perf_counter() - started:.0f} s", flush=True)
    targets = {label: target for label, _row, _over, target in RATIOS}
    for label, value in ratios(table).items():
        print(f"{label}: {value:.2f}x (target {targets[label]}x)")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.partitions", description=__doc__)
    parser.add_argument(
        "--url",
        default=os.environ.get("FUTOIN_EVT_TEST_PG", DEFAULT_PG),
        help="PostgreSQL to create databases on",
    )
    parser.add_argument("--events", type=int, default=20_000, help="events per measurement")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument(
        "--source",
        type=Path,
        help="add32: run the server from this tree; store: its store too, beside",
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
