"""The SQLite event store on a real file."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.model import EventRejected, UserId
from futoin_evt.storage.base import StoreClosed
from futoin_evt.storage.native import add_event, add_event_async
from futoin_evt.storage.sqlite import SqliteStore

pytestmark = pytest.mark.functional

BIG = 1 << 20
USER = UserId(1)


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(db_path) as opened:
        yield opened


async def test_ids_follow_commit_order_and_writes_are_durable_on_return(
    store: SqliteStore, db_path: Path
) -> None:
    ids = await asyncio.gather(*(store.append("T", json.dumps(i)) for i in range(500)))
    assert ids == list(range(1, 501))
    # Every returned id is visible to an independent connection right away.
    with sqlite3.connect(db_path) as other:
        (count,) = other.execute("SELECT COUNT(*) FROM events").fetchone()
    assert count == 500


async def test_ids_are_never_reused(db_path: Path) -> None:
    async with await SqliteStore.open(db_path) as store:
        for _ in range(3):
            await store.append("T", "1")
    with sqlite3.connect(db_path) as conn:
        conn.execute("DELETE FROM events WHERE id >= 2")
    async with await SqliteStore.open(db_path) as store:
        assert await store.append("T", "1") == 4


async def test_events_survive_reopening(db_path: Path) -> None:
    async with await SqliteStore.open(db_path) as store:
        await store.append("A", '{"k":[1,2]}')
    async with await SqliteStore.open(db_path) as store:
        page = await store.read_events(0, max_bytes=BIG)
    assert json.loads(page.json)[0]["data"] == {"k": [1, 2]}


async def test_close_commits_what_is_queued_and_refuses_more(db_path: Path) -> None:
    store = await SqliteStore.open(db_path)
    # gather starts the appends in order before close(): they are queued when it begins
    appends = [asyncio.ensure_future(store.append("T", "1")) for _ in range(50)]
    await asyncio.gather(*appends, store.close())
    assert sorted(a.result() for a in appends) == list(range(1, 51))
    with pytest.raises(StoreClosed):
        await store.append("T", "1")


async def test_read_pages_respect_limit_bytes_and_types(store: SqliteStore) -> None:
    for i in range(10):
        await store.append("EVEN" if i % 2 == 0 else "ODD", json.dumps("x" * 100))
    page = await store.read_events(0, limit=3, max_bytes=BIG)
    assert [e["id"] for e in json.loads(page.json)] == ["1", "2", "3"]
    assert page.last_id == 3
    small = await store.read_events(0, max_bytes=400)
    assert 1 <= small.count < 10
    assert len(small.json.encode()) <= 400
    odd = await store.read_events(0, types=["ODD"], max_bytes=BIG)
    assert [e["id"] for e in json.loads(odd.json)] == ["2", "4", "6", "8", "10"]
    none = await store.read_events(0, types=["OTHER"], max_bytes=BIG)
    assert (none.count, none.head_id) == (0, 10)


async def test_byte_limit_counts_utf8(store: SqliteStore) -> None:
    for _ in range(4):
        await store.append("T", json.dumps("é" * 100, ensure_ascii=False))
    page = await store.read_events(0, max_bytes=500)
    assert len(page.json.encode()) <= 500
    assert page.count == 1


async def test_consumers_positions_move_only_forward(store: SqliteStore) -> None:
    user = await store.add_user("u", "hash")
    assert await store.position(user, "C") is None
    assert await store.acknowledge(user, "C", 5) is None
    assert await store.register_consumer(user, "C") is True
    assert await store.register_consumer(user, "C") is False
    assert await store.acknowledge(user, "C", 5) == 5
    assert await store.acknowledge(user, "C", 3) == 5
    assert await store.position(user, "C") == 5


async def test_users(store: SqliteStore) -> None:
    await store.add_user("u", "h1")
    with pytest.raises(KeyError):
        await store.add_user("u", "h2")
    assert await store.set_password("u", "h3")
    user = await store.get_user("u")
    assert user is not None
    assert user.password_hash == "h3"
    await store.register_consumer(user.id, "C")
    assert await store.remove_user("u")
    assert await store.get_user("u") is None
    assert await store.position(user.id, "C") is None  # consumers go with their user


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
