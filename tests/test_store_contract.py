"""The storage contract, run against every backend: a SQLite file and a PostgreSQL database.

Only what truly differs between backends is tested elsewhere (test_store_sqlite.py,
test_postgres.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import AsyncIterator

import pytest

from futoin_evt.domain.groups import GroupClaim
from futoin_evt.domain.principal import Principal
from futoin_evt.domain.sessions import SessionLimits, SessionRow
from futoin_evt.domain.stream import UserId, utc_timestamp
from futoin_evt.domain.termini import KeptTerminus, TerminusKey
from futoin_evt.storage import open_store
from futoin_evt.storage.base import (
    SCHEMA_VERSION,
    Durability,
    SchemaTooNew,
    Store,
    StoreClosed,
    joined_count,
)
from futoin_evt.storage.head import SharedLook
from futoin_evt.storage.pages import rows_sql
from futoin_evt.storage.sqlite import MAX_WRITES_PER_COMMIT
from futoin_evt.storage.termini_sql import pack_ids, unpack_ids

from .conftest import execute_sql

pytestmark = pytest.mark.functional

BIG = 1 << 20
TS_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ\Z")


@pytest.fixture(params=[Durability.FULL, Durability.NORMAL], ids=["full", "normal"])
async def store(store_db: str, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """At NORMAL durability a lone SQLite write commits inline, on the event loop."""
    async with await open_store(store_db, durability=request.param) as opened:
        yield opened


def ids_of(page_json: str) -> list[int]:
    return [int(event["id"]) for event in json.loads(page_json)]


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


async def test_consumer_positions_move_only_forward(store: Store) -> None:
    user = await store.add_user("u", "hash")
    assert await store.position(user, "C") is None
    assert await store.acknowledge(user, "C", 5) is None
    assert await store.register_consumer(user, "C") is True
    assert await store.register_consumer(user, "C") is False
    assert await store.position(user, "C") == 0
    assert await store.acknowledge(user, "C", 5) == 5
    assert await store.acknowledge(user, "C", 3) == 5
    assert await store.position(user, "C") == 5
    # an operator's seek may go back
    assert await store.set_position(user, "C", 2)
    assert await store.position(user, "C") == 2
    assert not await store.set_position(user, "OTHER", 2)


async def test_a_claim_fences_acknowledgements_of_older_claims(store: Store) -> None:
    user = await store.add_user("u", "hash")
    assert await store.claim_consumer(user, "C") is None
    await store.register_consumer(user, "C")
    await store.acknowledge(user, "C", 2)
    first = await store.claim_consumer(user, "C")
    assert first is not None
    assert first[1] == 2
    assert await store.acknowledge(user, "C", 4, epoch=first[0]) == 4
    second = await store.claim_consumer(user, "C")
    assert second is not None
    assert second == (first[0] + 1, 4)
    assert await store.acknowledge(user, "C", 9, epoch=first[0]) is None  # the older stream
    assert await store.position(user, "C") == 4
    assert await store.acknowledge(user, "C", 9, epoch=second[0]) == 9
    assert await store.acknowledge(user, "C", 10) == 10  # a poll is not fenced


HOLD = 60.0


async def test_a_consumer_group_is_held_by_one_claim_at_a_time(store: Store) -> None:
    user = await store.add_user("u", "hash")
    assert await store.claim_group(user, "G", 1, hold_seconds=HOLD) == GroupClaim(True, 1, 1)
    # a live holder keeps it against its own epoch, no epoch, and a claim of free groups only
    assert await store.claim_group(user, "G", 1, hold_seconds=HOLD) == (False, 1, 1)
    assert await store.claim_group(user, "G", None, hold_seconds=HOLD) == (False, 1, 1)
    assert await store.claim_group(user, "G", 9, hold_seconds=HOLD, free_only=True) == (
        False,
        1,
        1,
    )
    # an equal Event Hubs owner level takes it over, so does a higher epoch
    assert await store.claim_group(user, "G", 1, hold_seconds=HOLD, equal_takes_over=True) == (
        True,
        2,
        1,
    )
    assert await store.claim_group(user, "G", 2, hold_seconds=HOLD) == (True, 3, 2)
    # another user's group of that name, and another partition's, are other groups
    other = await store.add_user("v", "hash")
    assert await store.claim_group(other, "G", None, hold_seconds=HOLD) == (True, 1, 0)
    info = await store.add_stream("orders", 2)
    orders1 = store.partition_log(info.partitions[1])
    assert await orders1.claim_group(user, "G", None, hold_seconds=HOLD) == (True, 1, 0)
    # renewing tells which holds another claim took
    assert await store.hold_groups([(user, "G", 2), (user, "G", 3)], HOLD) == [(user, "G", 2)]
    # released (an older claim releases nothing): free for any epoch; claim numbers go on
    await store.release_group(user, "G", 2)
    assert not (await store.claim_group(user, "G", None, hold_seconds=HOLD)).taken
    await store.release_group(user, "G", 3)
    assert await store.claim_group(user, "G", None, hold_seconds=HOLD) == (True, 4, 0)
    # the largest epoch a link can give is no error
    top = (1 << 63) - 1
    assert (await store.claim_group(user, "G", top, hold_seconds=HOLD)).taken
    assert await store.claim_group(user, "G", top, hold_seconds=HOLD) == (False, 5, top)
    # a hold that ran out (its process died, renewing nothing) keeps nobody out
    assert (await store.claim_group(user, "H", 7, hold_seconds=0)).taken
    assert await store.claim_group(user, "H", 1, hold_seconds=HOLD) == (True, 2, 1)


async def test_a_group_claim_fences_acknowledgements_of_older_claims(store: Store) -> None:
    user = await store.add_user("u", "hash")
    await store.register_consumer(user, "C")
    first = await store.claim_group(user, "ftn18:C", 1, hold_seconds=HOLD)
    assert await store.acknowledge_group(user, "ftn18:C", first.claim, "C", 3) == 3
    second = await store.claim_group(user, "ftn18:C", 2, hold_seconds=HOLD)
    assert second.taken
    assert await store.acknowledge_group(user, "ftn18:C", first.claim, "C", 9) is None
    assert await store.position(user, "C") == 3
    assert await store.acknowledge_group(user, "ftn18:C", second.claim, "C", 5) == 5
    assert await store.acknowledge_group(user, "ftn18:C", second.claim, "D", 5) is None
    assert await store.acknowledge_group(user, "ftn18:D", 1, "C", 7) is None  # no such group


def terminus(
    user: UserId, name: str, partition_key: int = 0, timeout: float = 60.0, group: str | None = None
) -> KeptTerminus:
    """A suspended link's terminus: two runs of unsettled ids, one held back."""
    key = TerminusKey(user, "container", name)
    return KeptTerminus(key, partition_key, group, 2, (3, 4, 5, 9), True, 9, (2, 3), 1, timeout)


async def test_a_kept_terminus_is_taken_once_whole(store: Store, store_db: str) -> None:
    user = await store.add_user("u", "hash")
    kept = terminus(user, "link", group="g")
    (row,) = await store.keep_termini([(kept, HOLD)], 64)
    assert row is not None
    assert await store.count_termini(user) == 1
    # kept again under its key: replaced, with a row of its own
    newer = dataclasses.replace(kept, after=10, unsettled=(10,))
    (again,) = await store.keep_termini([(newer, HOLD)], 64)
    assert again not in (None, row)
    assert await store.expire_termini([row, again], HOLD) == [again]  # the older row is gone
    # two processes resume it at once: one gets it, the other nothing
    async with await open_store(store_db) as other:
        both = await asyncio.gather(store.take_terminus(kept.key), other.take_terminus(kept.key))
    assert sorted(both, key=lambda found: found is None) == [newer, None]
    assert await store.take_terminus(kept.key) is None
    # its user, container and name find it: another container's is another terminus
    mine, theirs = (
        terminus(user, "x"),
        dataclasses.replace(terminus(user, "x"), key=TerminusKey(user, "other", "x")),
    )
    await store.keep_termini([(mine, HOLD), (theirs, HOLD)], 64)
    await store.discard_termini([mine.key])
    assert await store.take_terminus(mine.key) is None
    assert await store.take_terminus(theirs.key) == theirs


async def test_kept_termini_are_bounded_per_user_the_oldest_going_first(store: Store) -> None:
    alice = await store.add_user("alice", "hash")
    bob = await store.add_user("bob", "hash")
    first = [terminus(alice, name) for name in "abc"]
    await store.keep_termini([(t, HOLD) for t in first] + [(terminus(bob, "a"), HOLD)], 2)
    assert (await store.count_termini(alice), await store.count_termini(bob)) == (2, 1)
    assert await store.take_terminus(first[0].key) is None  # the oldest of alice went
    await store.keep_termini([(terminus(alice, "d"), HOLD)], 2)
    assert await store.take_terminus(first[1].key) is None
    assert await store.take_terminus(first[2].key) == first[2]
    assert await store.count_termini() == 2  # alice's d, bob's a


async def test_kept_termini_expire_by_the_database_clock_and_are_purged(
    store: Store, store_db: str
) -> None:
    user = await store.add_user("u", "hash")
    ended, leased, brief = (
        terminus(user, "ended"),
        terminus(user, "leased"),
        terminus(user, "brief", timeout=0),
    )
    kept = await store.keep_termini([(ended, 0.0), (leased, HOLD), (brief, 0.0)], 64)
    rows = [row for row in kept if row is not None]
    assert len(rows) == 3
    assert await store.count_termini(user) == 2  # 0 s after its end: gone at once
    # a renewal moves the expiry on; its end (grace 0) leaves the timeout; past it, gone
    assert await store.expire_termini(rows[:2], HOLD) == rows[:2]
    assert await store.expire_termini([rows[1]], -120.0) == [rows[1]]
    assert await store.count_termini(user) == 1
    assert await store.take_terminus(leased.key) is None  # expired: not resumed, and deleted
    assert await store.purge_termini() == 1  # the brief one
    names = execute_sql(store_db, "SELECT link_name FROM amqp_termini")
    assert names == [("ended",)]
    assert await store.take_terminus(ended.key) == ended


async def test_kept_termini_go_with_their_user_and_partition(store: Store) -> None:
    alice = await store.add_user("alice", "hash")
    bob = await store.add_user("bob", "hash")
    info = await store.add_stream("orders", 2)
    key = info.partitions[1].key
    await store.keep_termini([(terminus(alice, "a", key), HOLD), (terminus(bob, "b", 0), HOLD)], 64)
    await store.drop_stream("orders")
    assert await store.count_termini(alice) == 0
    assert await store.remove_user("bob")
    assert await store.count_termini() == 0
    # kept for a partition or user that is gone: not kept, no error
    rows = await store.keep_termini(
        [(terminus(alice, "a", key), HOLD), (terminus(bob, "b"), HOLD)], 64
    )
    assert rows == [None, None]


def test_event_ids_are_packed_as_runs() -> None:
    for ids in [(), (1,), (3, 4, 5, 9), (1, 2, 4, 5, 7), (9, 3, 4), tuple(range(1, 10_001))]:
        assert unpack_ids(pack_ids(ids)) == ids
    assert pack_ids(range(100, 10_100)) == "100-10099"
    assert pack_ids((3, 4, 5, 9, 11, 12)) == "3-5,9,11-12"


async def test_consumer_reads_start_at_the_position_or_later(store: Store) -> None:
    user = await store.add_user("u", "hash")
    for i in range(6):
        await store.append("A" if i % 2 else "B", str(i))
    assert await store.read_consumer_events(user, "C", max_bytes=BIG) is None
    await store.register_consumer(user, "C")
    await store.acknowledge(user, "C", 2)
    page = await store.read_consumer_events(user, "C", max_bytes=BIG)
    assert page is not None
    assert (ids_of(page.json), page.start_id) == ([3, 4, 5, 6], 2)
    page = await store.read_consumer_events(user, "C", at_least=4, types=["A"], max_bytes=BIG)
    assert page is not None
    assert (ids_of(page.json), page.start_id, page.head_id) == ([6], 4, 6)
    ranged = await store.read_range(user, "C", 3, 5, max_bytes=BIG, data_as_text=True)
    assert ranged is not None
    assert [(e["id"], e["data"]) for e in json.loads(ranged.json)] == [("4", "3"), ("5", "4")]
    assert ranged.start_id == 2
    assert await store.position(user, "C") == 2  # reading never moves it
    assert await store.read_range(user, "NONE", 0, None, max_bytes=BIG) is None


async def test_consumer_listing_lag_and_dropping(store: Store) -> None:
    alice = await store.add_user("alice", "h")
    bob = await store.add_user("bob", "h")
    await store.register_consumer(alice, "A")
    await store.register_consumer(bob, "B")
    for _ in range(4):
        await store.append("T", "1")
    await store.acknowledge(alice, "A", 3)
    rows = await store.consumers()
    assert [(r.user, r.user_id, r.component, r.position, r.behind) for r in rows] == [
        ("alice", alice, "A", 3, 1),
        ("bob", bob, "B", 0, 4),
    ]
    assert rows[0].oldest_unread_ts is not None
    assert TS_RE.match(rows[0].registered_at)
    assert TS_RE.match(rows[0].last_seen_at)
    assert [r.component for r in await store.consumers(bob)] == ["B"]
    assert await store.lowest_consumer() == ("bob", bob, "B")
    assert await store.consumer_state(alice, "A") == (3, 4)
    assert await store.drop_consumer(bob, "B")
    assert not await store.drop_consumer(bob, "B")
    assert await store.lowest_consumer() == ("alice", alice, "A")


async def test_consumer_lags_in_one_pass_equal_the_listing(store: Store) -> None:
    """The metrics' read: the same rows as :meth:`consumers`, with gaps in the ids (discarded
    events), consumers at one position, at the head and before the oldest event kept."""
    alice = await store.add_user("alice", "h")
    bob = await store.add_user("bob", "h")
    for _ in range(20):
        await store.append("T", "1")
    await store.delete_events(5, 1000)  # ids 1-5 gone
    positions = {"A": 0, "B": 7, "C": 7, "D": 20, "E": 12}
    for component, position in positions.items():
        user = alice if component < "D" else bob
        await store.register_consumer(user, component)
        await store.acknowledge(user, component, position)
    for _ in range(3):
        await store.append("T", "1")
    listed = await store.consumers()
    assert await store.consumer_lags(100) == listed
    assert [r.behind for r in listed] == [18, 16, 16, 3, 11]
    assert [r.component for r in await store.consumer_lags(2)] == ["A", "B"]
    assert await store.count_consumers() == 5


async def test_consumers_not_seen_expire_unless_touched(store: Store, store_db: str) -> None:
    user = await store.add_user("u", "h")
    await store.register_consumer(user, "OLD")
    await store.register_consumer(user, "SEEN")
    await store.register_consumer(user, "CONNECTED")
    long_ago = "2001-01-01T00:00:00Z"
    execute_sql(store_db, "UPDATE consumers SET last_seen_at = ?", (long_ago,))
    await store.register_consumer(user, "SEEN")  # registering again counts as seen
    await store.touch_consumers([(user, "CONNECTED"), (UserId(user + 100), "NONE")])
    await store.touch_consumers([])
    assert await store.expire_consumers(long_ago) == []
    assert await store.expire_consumers("2002-01-01T00:00:00Z") == [("u", "OLD")]
    assert [r.component for r in await store.consumers()] == ["CONNECTED", "SEEN"]


async def test_discard_limits_and_deleting_the_oldest(store: Store) -> None:
    limits = await store.discard_limits(None)
    assert tuple(limits) == (None, 0, 0, None, None)
    for _ in range(10):
        await store.append("T", "1")
    user = await store.add_user("u", "h")
    await store.register_consumer(user, "C")
    await store.acknowledge(user, "C", 6)
    limits = await store.discard_limits(utc_timestamp(time.time() + 5))
    assert tuple(limits) == (6, 10, 1, 10, None)
    assert (await store.discard_limits("2000-01-01T00:00:00Z")).older_than_kept is None
    assert await store.delete_events(4, 3) == 3  # the oldest three, within the bound
    assert await store.delete_events(4, 3) == 1
    assert await store.delete_events(4, 3) == 0
    assert (await store.stream_bounds()).first_id == 5
    assert ids_of((await store.read_events(0, max_bytes=BIG)).json)[0] == 5
    assert await store.id_before("2000-01-01T00:00:00Z") == 4


async def test_users(store: Store) -> None:
    first = await store.add_user("u", "h1")
    with pytest.raises(KeyError):
        await store.add_user("u", "h2")
    admin = await store.add_user("root", "h", is_admin=True)
    assert first != admin
    assert await store.set_password("u", "h3")
    assert not await store.set_password("nobody", "h3")
    user = await store.get_user("u")
    assert user is not None
    assert (user.id, user.name, user.password_hash, user.is_admin) == (first, "u", "h3", False)
    assert [(u.name, u.is_admin) for u in await store.list_users()] == [
        ("root", True),
        ("u", False),
    ]
    await store.register_consumer(user.id, "C")
    assert await store.remove_user("u")
    assert not await store.remove_user("u")
    assert await store.get_user("u") is None
    assert await store.position(user.id, "C") is None  # consumers go with their user


async def test_console_sessions_by_digest_bounded_and_expiring(store: Store) -> None:
    """The console's rules are its own; the store keeps the rows, ends those past the limits
    given at a login (the least recently used beyond the bound), and never moves a last use
    back."""
    alice = await store.add_user("alice", "x")
    root = await store.add_user("root", "x", is_admin=True)
    limits = SessionLimits(limit=2, idle_seconds=1800.0, lifetime_seconds=43200.0)
    a, b, c, d = (bytes([n]) * 32 for n in range(4))
    assert await store.add_console_session(a, alice, 1000.0, limits) == []
    assert await store.add_console_session(b, root, 1001.0, limits) == []
    await store.touch_console_sessions([a], 1002.0)  # a is the most recently used now
    await store.touch_console_sessions([a], 1001.5)  # never back
    assert await store.add_console_session(c, alice, 1003.0, limits) == [b]
    rows = await store.console_sessions([a, b, c])
    assert rows == {
        a: SessionRow(Principal(alice, "alice", False), 1000.0, 1002.0, None),
        c: SessionRow(Principal(alice, "alice", False), 1003.0, 1003.0, None),
    }
    await store.set_console_notice(c, "done")
    await store.clear_console_notice(c, "another")  # a newer notice stays
    assert (await store.console_sessions([c]))[c].notice == "done"
    await store.clear_console_notice(c, "done")
    assert (await store.console_sessions([c]))[c].notice is None
    # a login 30 minutes after a's last use ends it (c, used since, stays)
    await store.touch_console_sessions([c], 2000.0)
    assert await store.add_console_session(d, root, 1002.0 + 1800.5, limits) == [a]
    await store.end_console_session(d)
    assert set(await store.console_sessions([a, b, c, d])) == {c}
    assert await store.console_sessions([]) == {}
    assert await store.remove_user("alice")
    assert await store.console_sessions([c]) == {}  # sessions go with their user


async def test_consumers_are_counted_by_partition_in_one_read(store: Store) -> None:
    alice = await store.add_user("alice", "x")
    bob = await store.add_user("bob", "x")
    info = await store.add_stream("orders", 2)
    one = store.partition_log(info.partitions[1])
    await store.register_consumer(alice, "A")
    for user, component in ((alice, "A"), (alice, "B"), (bob, "A")):
        await one.register_consumer(user, component)
    key = info.partitions[1].key
    assert await store.consumer_counts() == {0: 1, key: 3}
    assert await store.consumer_counts(bob) == {key: 1}
    await store.drop_stream("orders")
    assert await store.consumer_counts() == {0: 1}


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
