"""The storage contract of appending and reading events: commit order, durability, pages, rows, run
against every backend (a SQLite file and a PostgreSQL database; see
:mod:`tests.support.stores`). Only what truly differs between backends is tested elsewhere
(test_store_sqlite.py, test_postgres.py)."""

from __future__ import annotations

import asyncio
import json
import re
import time

import pytest

from futoin_evt.domain.attrs import EventAttrs, attrs_json, parse_attrs
from futoin_evt.domain.stream import UserId, utc_timestamp
from futoin_evt.storage import open_store
from futoin_evt.storage.base import SCHEMA_VERSION, Store, joined_count
from futoin_evt.storage.dedup import WriterKey
from futoin_evt.storage.errors import DamagedEvent, SchemaTooNew, StoreClosed
from futoin_evt.storage.head import SharedLook
from futoin_evt.storage.pages import rows_sql
from futoin_evt.storage.sqlite.writer import MAX_WRITES_PER_COMMIT

from .support import stores
from .support.sql import execute_sql
from .support.stores import BIG, TS_RE, ids_of

pytestmark = pytest.mark.functional

#: Each backend at each durability.
store = stores.store


async def test_ids_follow_commit_order_and_writes_are_durable_on_return(
    store: Store, store_db: str
) -> None:
    ids = await asyncio.gather(*(store.append("T", json.dumps(i)) for i in range(500)))
    assert ids == list(range(1, 501))
    # Every returned id is visible to an independent connection right away, with its data.
    rows = execute_sql(store_db, "SELECT id, data FROM events ORDER BY id")
    assert rows == [(i + 1, json.dumps(i)) for i in range(500)]


async def test_concurrent_writers_on_one_database_never_let_a_reader_skip_an_id(
    store: Store, store_db: str
) -> None:
    """Two stores (as two processes would) add at once; a reader that always asks for
    ``id > last seen`` sees every id once, in order, and none it passed appears later."""
    async with await open_store(store_db) as other:
        producing = asyncio.gather(
            *(writer.append("T", str(i)) for i in range(300) for writer in (store, other))
        )
        seen: list[int] = []
        while not producing.done() or (seen and seen[-1] < await store.newest_event_id()):
            page = await store.read_events(seen[-1] if seen else 0, max_bytes=BIG)
            seen.extend(ids_of(page.json))
            await asyncio.sleep(0)  # let the producers run between reads
        added = await producing
    assert seen == sorted(added)
    assert len(set(added)) == 600


async def test_a_read_has_what_another_writer_committed_before_it(
    store: Store, store_db: str
) -> None:
    """The read starts within this store's own recent commits; what another store (as
    another process) committed after them is read too, whether this one heard of it yet or
    not, and the head learns of it. A reader the head wakes (``up_to_head``) gets what the
    head knows of."""
    mine = [await store.append("T", str(i)) for i in range(3)]
    async with await open_store(store_db) as other:
        theirs = [await other.append(t, "{}") for t in ("T", "U")]
    for after in mine:
        page = await store.read_events(after, max_bytes=BIG)
        assert ids_of(page.json) == [i for i in [*mine, *theirs] if i > after]
    typed = await store.read_events(mine[0], types=["U"], max_bytes=BIG)
    assert ids_of(typed.json) == theirs[1:]
    assert store.head.head == theirs[-1]
    known = await store.read_events(mine[1], max_bytes=BIG, up_to_head=True)
    assert ids_of(known.json) == [mine[2], *theirs]


async def test_a_shared_look_serves_those_who_asked_before_it_started() -> None:
    """Who asks while a read of the newest id runs gets the next one (started after the
    ask), shared with everyone else who asked meanwhile; a failure reaches them all."""
    reads: list[asyncio.Future[int]] = []

    async def read() -> int:
        reads.append(asyncio.get_running_loop().create_future())
        return await reads[-1]

    async def turns() -> None:
        for _ in range(5):
            await asyncio.sleep(0)  # the tasks run their steps (no time passes)

    look = SharedLook(read)
    first = asyncio.ensure_future(look.get())
    await turns()
    later = [asyncio.ensure_future(look.get()) for _ in range(3)]
    await turns()
    assert len(reads) == 1
    reads[0].set_result(5)
    await turns()
    assert len(reads) == 2
    reads[1].set_result(7)
    assert [await first, *await asyncio.gather(*later)] == [5, 7, 7, 7]
    failing = asyncio.ensure_future(look.get())
    await turns()
    reads[2].set_exception(ConnectionResetError("gone"))
    with pytest.raises(ConnectionResetError, match="gone"):
        await failing
    assert len(reads) == 3


async def test_another_writer_wakes_waiting_readers(store: Store, store_db: str) -> None:
    store.watch_other_writers(0.05)
    waiting = asyncio.ensure_future(store.head.wait_beyond(store.head.head))
    async with await open_store(store_db) as other:
        new_id = await other.append("T", "1")
    async with asyncio.timeout(30):
        await waiting
    assert store.head.head == new_id


async def test_ids_are_never_reused(store: Store) -> None:
    for _ in range(3):
        await store.append("T", "1")
    user = await store.add_user("u", "h")
    await store.register_consumer(user, "C")
    await store.acknowledge(user, "C", 3)
    assert await store.delete_events(3, 100) == 3
    assert await store.last_given_id() == 3
    assert await store.consumer_state(user, "C") == (3, 3)
    assert await store.append("T", "1") == 4


async def test_events_and_the_stream_name_survive_reopening(store_db: str) -> None:
    async with await open_store(store_db) as store:
        await store.append("A", '{"k":[1,2]}')
        name = await store.stream_id()
    async with await open_store(store_db) as store:
        page = await store.read_events(0, max_bytes=BIG)
        assert await store.stream_id() == name
        assert store.head.head == 1
    assert json.loads(page.json)[0]["data"] == {"k": [1, 2]}
    assert re.fullmatch(r"[0-9a-f]{16}", name)


async def test_a_newer_schema_is_refused(store_db: str) -> None:
    async with await open_store(store_db):
        pass
    execute_sql(store_db, "UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    newer = f"schema version {SCHEMA_VERSION + 1}, newer than this futoin-evt"
    with pytest.raises(SchemaTooNew, match=newer):
        await open_store(store_db)


async def test_close_commits_what_is_queued_and_refuses_more(store_db: str) -> None:
    store = await open_store(store_db)
    # gather starts the appends in order before close(): they are queued when it begins
    appends = [asyncio.ensure_future(store.append("T", "1")) for _ in range(50)]
    await asyncio.gather(*appends, store.close())
    assert sorted(a.result() for a in appends) == list(range(1, 51))
    with pytest.raises(StoreClosed):
        await store.append("T", "1")


async def test_read_pages_respect_limit_bytes_and_types(store: Store) -> None:
    for i in range(10):
        await store.append("EVEN" if i % 2 == 0 else "ODD", json.dumps("x" * 100))
    page = await store.read_events(0, limit=3, max_bytes=BIG)
    assert ids_of(page.json) == [1, 2, 3]
    assert (page.last_id, page.count, page.start_id, page.truncated) == (3, 3, 0, False)
    small = await store.read_events(0, max_bytes=400)
    assert 1 <= small.count < 10
    assert small.truncated
    assert len(small.json.encode()) <= 400
    odd = await store.read_events(0, types=["ODD"], max_bytes=BIG)
    assert ids_of(odd.json) == [2, 4, 6, 8, 10]
    none = await store.read_events(0, types=["OTHER"], max_bytes=BIG)
    assert (none.count, none.head_id) == (0, 10)
    assert (await store.read_events(10, max_bytes=BIG)).count == 0
    rows = await store.read_rows(8, limit=5)
    assert [row[:2] for row in rows] == [(9, "EVEN"), (10, "ODD")]
    assert rows[0][2] == json.dumps("x" * 100)


async def test_an_events_content_type_is_kept_with_it(store: Store) -> None:
    """The content type of the AMQP data section an event came as comes back with it, in a
    batch that mixes such events with others."""
    added = [
        store.submit_append("J", '{"k": 0}', "application/json"),
        store.submit_append("C", "1"),
        store.submit_append("B", '{"$binary":"AP8="}', ""),
    ]
    ids = await asyncio.gather(*added)
    rows = await store.read_rows(0, limit=10)
    assert [(r[0], r[2], r[4]) for r in rows] == [
        (ids[0], '{"k": 0}', "application/json"),
        (ids[1], "1", None),
        (ids[2], '{"$binary":"AP8="}', ""),
    ]
    page = await store.read_events(0, max_bytes=BIG)
    assert [e["data"] for e in json.loads(page.json)] == [{"k": 0}, 1, {"$binary": "AP8="}]


async def test_an_events_attrs_are_kept_with_it_and_covered_by_its_checksum(
    store: Store, store_db: str
) -> None:
    """An event's partition key and properties come back with it, whether it came alone, with
    a producer's key or in a batch with events that have none; a changed attribute fails the
    read as any damaged event does."""
    attrs = attrs_json(EventAttrs("order-7", (("raw", b"\x00\xff"), ("n", 1), ("n", None))))
    other = attrs_json(EventAttrs(None, (("trace", "t1"),), verbatim=True))
    alone = await store.submit_append("A", "1", None, None, attrs)
    keyed = await store.submit_append("K", "2", "", WriterKey(UserId(1), "k1"), other)
    batch = await store.submit_appends(
        [("B", "3", None, other), ("C", "4", None), ("D", '{"$binary":"AP8="}', "", attrs)]
    )
    rows = await store.read_rows(0, limit=10)
    assert [(r[0], r[2], r[4], r[5]) for r in rows] == [
        (alone, "1", None, attrs),
        (keyed, "2", "", other),
        (batch[0], "3", None, other),
        (batch[1], "4", None, None),
        (batch[2], '{"$binary":"AP8="}', "", attrs),
    ]
    assert parse_attrs(rows[0][5]) == EventAttrs("order-7", (("raw", b"\x00\xff"), ("n", 1),
                                                             ("n", None)))  # fmt: skip
    assert other is not None
    changed = other.replace("t1", "t2")
    execute_sql(store_db, "UPDATE events SET attrs = ? WHERE id = ?", (changed, batch[0]))
    with pytest.raises(DamagedEvent):
        await store.read_rows(keyed, limit=10)
    async with await open_store(store_db) as fresh:  # no recent events: the page is read
        with pytest.raises(DamagedEvent):
            await fresh.read_events(0, max_bytes=BIG)
        page = await fresh.read_events(batch[0], max_bytes=BIG)
        assert ids_of(page.json) == batch[1:]


async def test_read_rows_of_given_types_in_id_order(store: Store) -> None:
    for i in range(1, 31):
        await store.append("A" if i % 10 == 0 else "B" if i % 3 == 0 else "C", json.dumps(i))
    rows = await store.read_rows(0, limit=100, types=["A"])
    assert [(row[0], row[1], row[2]) for row in rows] == [(10, "A", "10"), (20, "A", "20"),
                                                          (30, "A", "30")]  # fmt: skip
    both = await store.read_rows(5, limit=4, types=["B", "A"])
    assert [row[:2] for row in both] == [(6, "B"), (9, "B"), (10, "A"), (12, "B")]
    assert await store.read_rows(30, limit=10, types=["A"]) == []
    assert await store.read_rows(0, limit=10, types=[]) == []
    assert await store.read_rows(0, limit=10, types=["NONE"]) == []


async def test_a_typed_read_goes_through_the_type_index(store: Store, store_db: str) -> None:
    """Push-down: the events of the other types are not read (a plan on 100,000 rows)."""
    postgres = store_db.startswith("postgresql://")
    numbers = (
        "SELECT i FROM generate_series(1, 100000) AS i"
        if postgres
        else "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000)"
        " SELECT i FROM n"
    )
    execute_sql(
        store_db,
        "INSERT INTO events (type, data, ts) SELECT CASE WHEN i IN (50000, 100000) THEN 'RARE'"
        f" ELSE 'COMMON' END, '{{}}', '2026-11-23T10:00:00Z' FROM ({numbers}) AS numbers",
    )
    execute_sql(store_db, "ANALYZE events" if postgres else "ANALYZE")
    sql, params = rows_sql("?", 0, 1000, ["RARE", "OTHER"])
    plan = execute_sql(store_db, ("EXPLAIN " if postgres else "EXPLAIN QUERY PLAN ") + sql, params)
    lines = [str(row[0] if postgres else row[3]) for row in plan]
    assert sum("events_by_type" in line for line in lines) == 2, lines
    assert not any("Seq Scan" in line or line.startswith("SCAN events") for line in lines), lines
    assert [row[1] for row in await store.read_rows(0, limit=10, types=["RARE"])] == ["RARE"] * 2


async def test_byte_limit_counts_utf8(store: Store) -> None:
    for _ in range(4):
        await store.append("T", json.dumps("é" * 100, ensure_ascii=False))
    page = await store.read_events(0, max_bytes=500)
    assert len(page.json.encode()) <= 500
    assert page.count == 1
    # a fresh store reads from the database, not from what it added itself
    assert page.items == [json.dumps(json.loads(page.json)[0], ensure_ascii=False,
                                     separators=(",", ":"))]  # fmt: skip


async def test_timestamps_are_utc_seconds_of_the_commit(store: Store) -> None:
    before = utc_timestamp(time.time() - 1)
    await store.append("T", "1")
    (event,) = json.loads((await store.read_events(0, max_bytes=BIG)).json)
    assert TS_RE.match(event["ts"])
    assert before <= event["ts"] <= utc_timestamp(time.time() + 1)
    assert await store.id_before(utc_timestamp(time.time() + 5)) == 1
    assert await store.id_before("2000-01-01T00:00:00Z") is None
    bounds = await store.stream_bounds()
    assert (bounds.first_id, bounds.last_id, bounds.events) == (1, 1, 1)
    assert bounds.first_ts == bounds.last_ts == event["ts"]


async def test_events_appended_together_are_committed_in_one_transaction(store: Store) -> None:
    """A group of appends (an AMQP batch) is never split between two commits, also where the
    writer's batch is full: it is stored whole or not at all."""
    singles = [store.submit_append("S", str(n)) for n in range(MAX_WRITES_PER_COMMIT - 2)]
    group = store.submit_appends([("G", str(n), None) for n in range(5)])
    commits_before = sum(store.write_stats.batch_sizes.counts)
    await asyncio.gather(*singles)
    ids = await group
    assert ids == list(range(ids[0], ids[0] + 5))
    sizes = store.write_stats.batch_sizes
    assert sum(sizes.counts) - commits_before == 1  # not split: one commit took them all
    assert sizes.sum >= MAX_WRITES_PER_COMMIT + 3
    rows = await store.read_rows(ids[0] - 2, limit=10)
    assert [(r[1], r[2]) for r in rows] == [("S", str(MAX_WRITES_PER_COMMIT - 3))] + [
        ("G", str(n)) for n in range(5)
    ]


def test_a_commit_takes_a_run_of_joined_appends_whole() -> None:
    class Write:
        def __init__(self, joined: bool) -> None:
            self.joined = joined

    queue = [Write(False), Write(True), Write(True), Write(False), Write(False)]
    assert joined_count(queue, 1) == 1
    assert joined_count(queue, 2) == 4
    assert joined_count(queue, 4) == 4
    assert joined_count(queue, 10) == 5
