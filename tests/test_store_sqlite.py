"""The SQLite store's native extension: events added in an application's own transaction.

What every backend does is in test_store_contract.py.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.domain.stream import EventRejected, UserId
from futoin_evt.storage.base import SCHEMA_VERSION
from futoin_evt.storage.native import add_event, add_event_async
from futoin_evt.storage.schema import MIGRATIONS
from futoin_evt.storage.sqlite import SqliteStore

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
