"""The SQLite store's native extension: events added in an application's own transaction.

What every backend does is in test_store_contract.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.domain.stream import EventRejected, UserId
from futoin_evt.storage.base import SCHEMA_VERSION, Durability
from futoin_evt.storage.sqlite import SqliteStore
from futoin_evt.storage.sqlite.native import add_event, add_event_async
from futoin_evt.storage.sqlite.schema import MIGRATIONS
from futoin_evt.storage.sqlite.writer import CHECKPOINT_COMMITS

pytestmark = pytest.mark.functional

BIG = 1 << 20


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(db_path) as opened:
        yield opened


async def test_a_version_1_file_is_migrated_and_keeps_its_data(db_path: Path) -> None:
    """Files from before the schema_version table carry version 1 in PRAGMA user_version."""
    with sqlite3.connect(db_path) as conn:
        for statement in MIGRATIONS[1].split(";"):
            conn.execute(statement)
        conn.execute("INSERT INTO users (name, password_hash, created_at) VALUES ('u', 'h', 't')")
        conn.execute("INSERT INTO consumers VALUES (1, 'C', 7, 't', 't')")
        conn.execute("PRAGMA user_version = 1")
    async with await SqliteStore.open(db_path) as store:
        assert await store.claim_consumer(UserId(1), "C") == (1, 7)
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]


async def test_native_extension_commits_with_the_application(
    store: SqliteStore, db_path: Path
) -> None:
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
    conn.execute("INSERT INTO accounts VALUES (1, 100)")
    conn.commit()
    with conn:
        conn.execute("UPDATE accounts SET balance = 90 WHERE id = 1")
        event_id = add_event(conn, "XFER", {"amount": -10})

    def failing_transfer() -> None:
        with conn:
            conn.execute("UPDATE accounts SET balance = 0 WHERE id = 1")
            add_event(conn, "XFER", {"amount": -90})
            raise RuntimeError("the business step failed")

    with pytest.raises(RuntimeError):
        failing_transfer()
    conn.close()
    page = json.loads((await store.read_events(0, max_bytes=BIG)).json)
    assert [(e["id"], e["data"]) for e in page] == [(str(event_id), {"amount": -10})]
    # the server's own writer continues after the application's ids
    assert await store.append("T", "1") == event_id + 1


async def test_native_extension_async_and_rejects_bad_events(db_path: Path) -> None:
    import aiosqlite

    async with await SqliteStore.open(db_path):
        pass
    async with aiosqlite.connect(db_path) as conn:
        assert await add_event_async(conn, "A", [1]) == 1
        await conn.commit()
        with pytest.raises(EventRejected):
            await add_event_async(conn, "a", 1)
        with pytest.raises(EventRejected):
            await add_event_async(conn, "A", "x" * 70_000)


async def test_at_normal_a_lone_append_waits_for_another_writer_without_blocking_the_loop(
    db_path: Path,
) -> None:
    """Lone appends commit inline at NORMAL, unless another connection holds the file's
    write lock: then it waits on the writer thread, and the server keeps answering."""
    async with await SqliteStore.open(db_path, durability=Durability.NORMAL) as store:
        assert await store.append("FIRST", "1") == 1
        other = sqlite3.connect(db_path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO events (type, data, ts) VALUES ('OTHER', '2', 'x')")
        append = asyncio.ensure_future(store.append("SECOND", "3"))
        # the loop still serves reads while the append waits for the lock
        assert await store.newest_event_id() == 1
        assert not append.done()
        other.execute("COMMIT")
        other.close()
        assert await append == 3
        assert await store.append("THIRD", "4") == 4  # inline again
    rows = sqlite3.connect(db_path).execute("SELECT id, type FROM events ORDER BY id").fetchall()
    assert rows == [(1, "FIRST"), (2, "OTHER"), (3, "SECOND"), (4, "THIRD")]


def wal_size(db_path: Path) -> int:
    return os.path.getsize(f"{db_path}-wal")


async def test_at_normal_the_wal_is_checkpointed_by_the_writer(db_path: Path) -> None:
    """SQLite's own checkpoints are off at NORMAL (they would run inline); the writer's keep
    the WAL from growing without end."""
    async with await SqliteStore.open(db_path, durability=Durability.NORMAL) as store:
        for i in range(20 * CHECKPOINT_COMMITS):  # 2 pages or more each: 40 MB, unchecked
            await store.append("T", json.dumps(i))
        wal = wal_size(db_path)
    assert wal < 4 * 1000 * 4096  # a few times SQLite's default of 1,000 pages
