"""The SQLite store's reads on its own thread and connection, and the push stream that reads
one page ahead of what it sends."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from futoin_evt.client.aio import EventStreamClient
from futoin_evt.client.receiver import ReliableReceiver
from futoin_evt.domain.stream import UserId
from futoin_evt.ftn18.push import PushConfig
from futoin_evt.server.app import EventServer
from futoin_evt.storage.errors import StoreClosed
from futoin_evt.storage.sqlite import SqliteStore
from futoin_evt.storage.sqlite.native import add_event

from .support.push import Collector, add_many, running, stop
from .support.servers import ALICE, ClientFactory, ServerFactory

pytestmark = pytest.mark.functional

BIG = 1 << 20
USER = UserId(1)


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SqliteStore]:
    async with await SqliteStore.open(db_path) as opened:
        await opened.add_user("reader", "hash")
        await opened.register_consumer(USER, "C")
        yield opened


async def read_all(store: SqliteStore, after_id: int, max_bytes: int) -> list[int]:
    """Every stored event after ``after_id``, page by page from the store (not the recent
    events this process committed), as ids."""
    ids: list[int] = []
    while True:
        page = await store.read_consumer_events(USER, "C", at_least=after_id, max_bytes=max_bytes)
        assert page is not None
        if not page.count:
            return ids
        ids.extend(int(json.loads(item)["id"]) for item in page.items)
        after_id = page.last_id


async def test_pages_read_while_the_writer_commits_hold_committed_events_in_id_order(
    store: SqliteStore,
) -> None:
    writes = asyncio.gather(*(store.append("E", json.dumps({"i": i})) for i in range(3000)))
    seen: list[int] = []
    while len(seen) < 3000:  # small pages, read while the group commits go on
        seen.extend(await read_all(store, seen[-1] if seen else 0, 2048))
    ids = await writes
    assert seen == ids == list(range(1, 3001))


async def test_a_read_sees_no_open_transaction_and_holds_no_snapshot(
    store: SqliteStore, db_path: Path
) -> None:
    for i in range(30):
        await store.append("E", json.dumps({"i": i}))
    other = sqlite3.connect(db_path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        uncommitted = add_event(other, "LATE", {"late": True})
        # a page cut short by its size leaves rows unread: its statement must not stay open
        page = await store.read_consumer_events(USER, "C", max_bytes=100)
        assert page is not None
        assert page.truncated
        assert page.last_id == 1
        assert await read_all(store, 0, BIG) == list(range(1, 31))
        other.execute("COMMIT")
    finally:
        other.close()
    assert await read_all(store, 0, BIG) == [*range(1, 31), uncommitted]
    rows = await store.read_rows(30, limit=10)
    assert [(row[0], row[1]) for row in rows] == [(uncommitted, "LATE")]


async def test_a_closed_store_answers_reads_with_its_closed_error(db_path: Path) -> None:
    store = await SqliteStore.open(db_path)
    await store.append("E", "1")
    await store.close()
    with pytest.raises(StoreClosed):
        await store.read_rows(0, limit=10)
    with pytest.raises(StoreClosed):
        await store.read_consumer_events(USER, "C", max_bytes=BIG)
    with pytest.raises(StoreClosed):
        await store.stream_bounds()


async def test_a_failed_read_reaches_its_caller_and_the_next_reads_are_answered(
    store: SqliteStore, db_path: Path
) -> None:
    info = await store.add_stream("orders", 1)
    orders = store.partition_log(info.partitions[0])
    await orders.append("E", "1")
    await store.append("E", "2")
    with sqlite3.connect(db_path) as other:
        table = other.execute(
            "SELECT name FROM sqlite_master WHERE name LIKE 'events_%' AND type = 'table'"
        ).fetchone()[0]
        other.execute(f"DROP TABLE {table}")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        await orders.read_rows(0, limit=10)
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        await orders.read_range(USER, "C", 0, None, max_bytes=BIG)
    assert [row[0] for row in await store.read_rows(0, limit=10)] == [1]


BACKLOG = 600


@pytest.fixture
async def server(db_path: Path, start_server: ServerFactory) -> EventServer:
    """A server whose events before it started are read from the file, in groups of 2 KiB
    (some 25 events each)."""
    async with await SqliteStore.open(db_path) as before:
        for i in range(BACKLOG):
            await before.append("OLD", json.dumps({"i": i}))
    return await start_server(push=PushConfig(max_group_bytes=2048))


async def test_a_push_stream_reading_ahead_sends_each_event_once_in_order(
    server: EventServer, connect: ClientFactory
) -> None:
    """A backlog of many pages from the store while new events arrive: the page read
    ahead of each one sent never repeats or skips an event."""
    alice: EventStreamClient = await connect("alice")
    app = Collector()
    receiver = ReliableReceiver(server.url, credentials=ALICE, component="P", on_events=app)
    task = await running(receiver)
    live = await add_many(alice, 600)
    await app.wait_for(live[-1])
    await stop(receiver, task)
    assert live[0] > BACKLOG
    assert app.ids == list(range(1, BACKLOG + 1)) + live
    assert live == list(range(BACKLOG + 1, live[-1] + 1))
