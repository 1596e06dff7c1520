"""``python -m bench.pg_driver [--url URL]``: psycopg 3 beside asyncpg on the statements the
PostgreSQL store runs most, each driver on one connection to a new database:

- a group commit of 32 events: advisory lock, one multi-row INSERT ... RETURNING, NOTIFY,
  COMMIT (events/s);
- an acknowledgement: one UPDATE ... RETURNING per call, autocommit (calls/s);
- a page read: 1,000 events after an id, as the poll and push paths read them (events/s).

psycopg sends the batch's statements as one pipeline; asyncpg runs them in a transaction
block (it has no pipeline for separate statements).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import asyncpg
import psycopg

from .postgres import DEFAULT_PG, database
from .systems import prefill_rows

BATCH: Final = 32
LOCK: Final = "SELECT pg_advisory_xact_lock(4609102, 1)"
SCHEMA: Final = (
    "CREATE TABLE events (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, type TEXT NOT NULL,"
    " data TEXT NOT NULL, ts TEXT NOT NULL)",
    "CREATE TABLE consumers (id INT PRIMARY KEY, position BIGINT NOT NULL)",
    "INSERT INTO consumers VALUES (1, 0)",
)


async def psycopg_run(url: str, events: int, acks: int, reads: int) -> dict[str, float]:
    rows = prefill_rows(BATCH)
    types, datas, tss = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    result = {}
    async with await psycopg.AsyncConnection.connect(url) as conn:

        async def batch() -> None:
            async with conn.transaction(), conn.pipeline():
                await conn.execute(LOCK)
                await conn.execute(
                    "INSERT INTO events (type, data, ts) SELECT * FROM"
                    " unnest(%s::text[], %s::text[], %s::text[]) RETURNING id",
                    (types, datas, tss),
                )
                await conn.execute("SELECT pg_notify('bench', '1')")

        result["append"] = await _rate(batch, events // BATCH) * BATCH
        await conn.set_autocommit(True)
        position = iter(range(1, acks + 1))

        async def ack() -> None:
            await conn.execute(
                "UPDATE consumers SET position = GREATEST(position, %s) WHERE id = 1"
                " RETURNING position",
                (next(position),),
            )

        result["ack"] = await _rate(ack, acks)

        async def read() -> None:
            cursor = await conn.execute(
                "SELECT id, type, data, ts FROM events WHERE id > %s ORDER BY id LIMIT 1000",
                (0,),
            )
            await cursor.fetchall()

        result["read"] = await _rate(read, reads) * 1000
    return result


async def asyncpg_run(url: str, events: int, acks: int, reads: int) -> dict[str, float]:
    rows = prefill_rows(BATCH)
    types, datas, tss = [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]
    result = {}
    conn: Any = await asyncpg.connect(url)
    try:

        async def batch() -> None:
            async with conn.transaction():
                await conn.execute(LOCK)
                await conn.fetch(
                    "INSERT INTO events (type, data, ts) SELECT * FROM"
                    " unnest($1::text[], $2::text[], $3::text[]) RETURNING id",
                    types,
                    datas,
                    tss,
                )
                await conn.execute("SELECT pg_notify('bench', '1')")

        result["append"] = await _rate(batch, events // BATCH) * BATCH
        position = iter(range(1, acks + 1))

        async def ack() -> None:
            await conn.fetch(
                "UPDATE consumers SET position = GREATEST(position, $1) WHERE id = 1"
                " RETURNING position",
                next(position),
            )

        result["ack"] = await _rate(ack, acks)

        async def read() -> None:
            await conn.fetch(
                "SELECT id, type, data, ts FROM events WHERE id > $1 ORDER BY id LIMIT 1000", 0
            )

        result["read"] = await _rate(read, reads) * 1000
    finally:
        await conn.close()
    return result


async def _rate(step: Callable[[], Awaitable[None]], count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        await step()
    return count / (time.perf_counter() - start)


async def main_async(url: str) -> None:
    sizes = (32_000, 3_000, 300)
    figures = {}
    for name, run in (("psycopg 3", psycopg_run), ("asyncpg", asyncpg_run)):
        async with database(url) as db:
            async with await psycopg.AsyncConnection.connect(db, autocommit=True) as conn:
                for statement in SCHEMA:
                    await conn.execute(statement)
            figures[name] = await run(db, *sizes)
    print(f"{'':28} | {'psycopg 3':>10} | {'asyncpg':>10}")
    for key, label in (
        ("append", "group commit of 32 (events/s)"),
        ("ack", "acknowledge (calls/s)"),
        ("read", "page read (events/s)"),
    ):
        print(
            f"{label:28} | {figures['psycopg 3'][key]:>10,.0f} | {figures['asyncpg'][key]:>10,.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.pg_driver", description=__doc__)
    parser.add_argument("--url", default=os.environ.get("FUTOIN_EVT_TEST_PG", DEFAULT_PG))
    asyncio.run(main_async(parser.parse_args().url))


if __name__ == "__main__":
    main()
