"""Streams and partitions in the store, run against every backend: the registry, each
partition a log of its own (ids, head, consumers, retention, DCB), and the migration of a
database written by the release before them."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from futoin_evt.domain.dcb import AppendCondition, AppendConditionFailed, NewEvent, Query, QueryItem
from futoin_evt.domain.partition import (
    DEFAULT_PARTITION,
    MAX_PARTITIONS,
    Partition,
    StreamInfo,
    check_stream_name,
)
from futoin_evt.storage import open_store
from futoin_evt.storage.base import SCHEMA_VERSION, PartitionLog, Store
from futoin_evt.storage.errors import StoreClosed

from .support.sql import execute_sql, pg_schema_at
from .support.stores import ids_of
from .support.waiting import until

pytestmark = pytest.mark.functional

BIG = 1 << 20
DATA = Path(__file__).parent / "data"


def columns(db: str, table: str) -> list[tuple[str, str]]:
    if db.startswith("postgresql://"):
        rows = execute_sql(
            db,
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_name = ? ORDER BY ordinal_position",
            (table,),
        )
    else:
        rows = [(r[1], r[2]) for r in execute_sql(db, f"PRAGMA table_info({table})")]
    return [(str(name), str(kind)) for name, kind in rows]


async def test_the_log_so_far_is_events_partition_0(store: Store) -> None:
    (info,) = await store.streams()
    assert (info.name, info.partitions, info.aggregate_of) == ("events", (DEFAULT_PARTITION,), None)
    assert await store.stream("events") == info
    assert await store.stream("nothing") is None
    assert store.partition_log(DEFAULT_PARTITION) is store
    assert await store.streams_version() == 0


async def test_each_partition_has_its_own_ids_head_and_tables(store: Store, store_db: str) -> None:
    await store.append("T", "0")
    info = await store.add_stream("orders", 3)
    assert [(p.stream, p.number) for p in info.partitions] == [("orders", n) for n in range(3)]
    assert len({p.key for p in info.partitions} | {0}) == 4
    logs = [store.partition_log(p) for p in info.partitions]
    assert store.partition_log(info.partitions[1]) is logs[1]
    ids = await asyncio.gather(*(log.append("T", str(i)) for i in range(5) for log in logs))
    assert sorted(ids) == sorted(list(range(1, 6)) * 3)
    for number, log in enumerate(logs):
        page = await log.read_events(0, max_bytes=BIG)
        assert ids_of(page.json) == [1, 2, 3, 4, 5]
        assert log.head.head == 5
        assert await log.newest_event_id() == await log.last_given_id() == 5
        assert log.partition.number == number
    assert ids_of((await store.read_events(0, max_bytes=BIG)).json) == [1]
    assert store.head.head == 1
    # a partition's table has every column of events, in the same order
    key = info.partitions[2].key
    assert columns(store_db, f"events_{key}") == columns(store_db, "events")
    # reopened: still there
    async with await open_store(store_db) as again:
        assert await again.stream("orders") == info
        assert (await again.partition_log(info.partitions[0]).stream_bounds()).events == 5


async def test_bad_streams_are_refused_and_nothing_is_stored(store: Store) -> None:
    for name in ("", "Orders", "-x", "a" * 49, "feed", "dcb", "metrics", "a/b", "é", "a b"):
        with pytest.raises(ValueError, match="stream name"):
            await store.add_stream(name, 1)
    for count in (0, -1, MAX_PARTITIONS + 1):
        with pytest.raises(ValueError, match="1 to 1024 partitions"):
            await store.add_stream("fine", count)
    await store.add_stream("fine", 2)
    with pytest.raises(KeyError):
        await store.add_stream("fine", 3)
    with pytest.raises(KeyError):
        await store.add_stream("events", 1)
    with pytest.raises(ValueError, match="can only grow"):
        await store.grow_stream("fine", 1)
    with pytest.raises(KeyError):
        await store.grow_stream("nothing", 3)
    with pytest.raises(ValueError, match="1 to 1024 partitions"):
        await store.grow_stream("fine", MAX_PARTITIONS + 1)
    with pytest.raises(ValueError, match="cannot be dropped"):
        await store.drop_stream("events")
    assert not await store.drop_stream("nothing")
    assert [(s.name, len(s.partitions)) for s in await store.streams()] == [
        ("events", 1),
        ("fine", 2),
    ]
    assert await store.streams_version() == 1
    assert check_stream_name("a-0_b") == "a-0_b"


async def test_growing_adds_partitions_and_moves_the_version(store: Store) -> None:
    before = await store.add_stream("s", 1)
    await store.partition_log(before.partitions[0]).append("T", "1")
    version = await store.streams_version()
    grown = await store.grow_stream("s", 4)
    assert grown.partitions[0] == before.partitions[0]
    assert [p.number for p in grown.partitions] == [0, 1, 2, 3]
    assert await store.streams_version() == version + 1
    assert await store.grow_stream("s", 4) == grown  # nothing to do
    assert await store.streams_version() == version + 1
    assert await store.partition_log(grown.partitions[3]).append("T", "1") == 1
    assert await store.partition_log(grown.partitions[0]).append("T", "1") == 2


async def test_consumers_positions_and_discarding_per_partition(store: Store) -> None:
    user = await store.add_user("u", "h")
    info = await store.add_stream("s", 2)
    first, second = (store.partition_log(p) for p in info.partitions)
    for log, count in ((store, 3), (first, 6), (second, 9)):
        for _ in range(count):
            await log.append("T", "1")
    for log in (store, first, second):
        assert await log.register_consumer(user, "C") is True
    assert await first.acknowledge(user, "C", 4) == 4
    assert await second.acknowledge(user, "C", 7) == 7
    assert await store.position(user, "C") == 0
    claimed = await second.claim_consumer(user, "C")
    assert claimed is not None
    assert claimed[1] == 7
    assert await first.acknowledge(user, "C", 5, epoch=claimed[0]) is None  # not its epoch
    assert [(r.component, r.position, r.behind) for r in await first.consumers()] == [("C", 4, 2)]
    assert [(r.position, r.behind) for r in await second.consumers(user)] == [(7, 2)]
    assert await second.consumer_state(user, "C") == (7, 9)
    page = await first.read_consumer_events(user, "C", max_bytes=BIG)
    assert page is not None
    assert ids_of(page.json) == [5, 6]
    # discarding one partition leaves the others alone
    limits = await first.discard_limits(None)
    assert (limits.lowest_position, limits.newest_id, limits.oldest_id) == (4, 6, 1)
    assert await first.delete_events(4, 100) == 4
    assert (await first.stream_bounds()).first_id == 5
    assert (await second.stream_bounds()).first_id == 1
    assert (await store.stream_bounds()).first_id == 1
    assert await second.drop_consumer(user, "C")
    assert await first.position(user, "C") == 4
    assert await second.position(user, "C") is None
    assert await store.remove_user("u")  # consumers of every partition go with the user
    assert await first.position(user, "C") is None


async def test_dcb_append_and_read_on_a_partition(store: Store) -> None:
    info = await store.add_stream("ledger", 2)
    log = store.partition_log(info.partitions[1])
    await store.dcb_append([NewEvent("Opened", '{"a":0}', ("acct:1",))], None)
    position = await log.dcb_append([NewEvent("Opened", '{"a":1}', ("acct:1",), "x-1")], None)
    assert position == 1
    query = Query((QueryItem(tags=frozenset({"acct:1"})),))
    with pytest.raises(AppendConditionFailed):
        await log.dcb_append(
            [NewEvent("Closed", "{}", ("acct:1",))], AppendCondition(query, after=None)
        )
    assert (
        await log.dcb_append(
            [NewEvent("Closed", "{}", ("acct:1",))], AppendCondition(query, after=1)
        )
        == 2
    )
    assert await log.dcb_append([NewEvent("Opened", '{"a":1}', ("acct:1",), "x-1")], None) == 1
    events, head = await log.dcb_read(query, after=None, before=None, limit=10)
    assert [(e.position, e.type, e.tags) for e in events] == [
        (1, "Opened", ("acct:1",)),
        (2, "Closed", ("acct:1",)),
    ]
    assert head == 2
    events, _ = await store.dcb_read(query, after=None, before=None, limit=10)
    assert [e.data_json for e in events] == ['{"a":0}']


async def test_dropping_a_stream_removes_its_data(store: Store, store_db: str) -> None:
    user = await store.add_user("u", "h")
    info = await store.add_stream("gone", 2)
    log = store.partition_log(info.partitions[0])
    await log.append("T", "1")
    await log.register_consumer(user, "C")
    await store.register_consumer(user, "C")
    version = await store.streams_version()
    assert await store.drop_stream("gone")
    with pytest.raises(StoreClosed, match="the stream gone was dropped"):
        await log.append("T", "2")
    with pytest.raises(StoreClosed, match="the stream gone was dropped"):
        await log.dcb_append([NewEvent("T", "2")], None)
    assert await store.stream("gone") is None
    assert await store.streams_version() == version + 1
    assert await store.position(user, "C") == 0
    count = execute_sql(store_db, "SELECT COUNT(*) FROM consumers")[0][0]
    assert count == 1
    for p in info.partitions:
        assert columns(store_db, f"events_{p.key}") == []
    again = await store.add_stream("gone", 1)
    assert again.partitions[0].key not in {p.key for p in info.partitions}
    assert await store.partition_log(again.partitions[0]).append("T", "1") == 1


async def test_writers_on_several_partitions_never_let_a_reader_skip_an_id(
    store: Store, store_db: str
) -> None:
    """Two stores (as two processes would) add to three partitions at once; a reader of each
    partition that asks for ``id > last seen`` sees every id once, in order."""
    info = await store.add_stream("busy", 3)
    async with await open_store(store_db) as other:
        logs = {p.key: (store.partition_log(p), other.partition_log(p)) for p in info.partitions}
        producing = asyncio.gather(
            *(w.append("T", str(i)) for i in range(150) for pair in logs.values() for w in pair)
        )
        seen: dict[int, list[int]] = {key: [] for key in logs}

        async def newest() -> list[int]:
            return [await logs[key][0].newest_event_id() for key in logs]

        while not producing.done() or [s[-1] if s else 0 for s in seen.values()] != await newest():
            for key, (reader, _) in logs.items():
                after = seen[key][-1] if seen[key] else 0
                seen[key].extend(ids_of((await reader.read_events(after, max_bytes=BIG)).json))
            await asyncio.sleep(0)
        await producing
    for ids in seen.values():
        assert ids == list(range(1, 301))


async def test_partitions_are_typed_as_logs(store: Store) -> None:
    info = await store.add_stream("typed", 1)
    log: PartitionLog = store.partition_log(info.partitions[0])
    assert log.partition == Partition("typed", 0, info.partitions[0].key)
    assert isinstance(info, StreamInfo)


async def test_a_database_of_the_previous_release_opens_as_events_0(tmp_path: Path) -> None:
    """schema-v4.sqlite was written by the release before streams (tests/data/make_schema_v4.py)."""
    db = tmp_path / "old.sqlite"
    shutil.copy(DATA / "schema-v4.sqlite", db)
    async with await open_store(str(db)) as store:
        page = await store.read_events(0, max_bytes=BIG)
        assert ids_of(page.json) == [1, 2, 3, 4, 5, 6, 7]
        rows = await store.read_rows(5, limit=1)
        assert rows[0][4] == "application/json"
        user = await store.get_user("olduser")
        assert user is not None
        assert user.is_admin
        assert await store.position(user.id, "OLDC") == 4
        assert await store.claim_consumer(user.id, "OLDC") == (3, 4)  # epoch 2 was kept
        events, head = await store.dcb_read(
            Query((QueryItem(tags=frozenset({"acct:1"})),)), after=None, before=None, limit=9
        )
        assert [(e.position, e.id, e.tags) for e in events] == [(7, "dcb-1", ("acct:1", "kind"))]
        assert head == 7
        assert await store.append("NEW", "1") == 8
        assert [s.name for s in await store.streams()] == ["events"]
        info = await store.add_stream("later", 1)
        assert await store.partition_log(info.partitions[0]).append("T", "1") == 1
    assert execute_sql(str(db), "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


_WRITER = """
import asyncio, sys
from futoin_evt.domain.partition import Partition
from futoin_evt.storage import open_store

async def main(db, count, keys):
    async with await open_store(db) as store:
        logs = [store.partition_log(Partition("busy", n, int(k))) for n, k in enumerate(keys)]
        for start in range(0, count, 25):
            await asyncio.gather(*(log.append("T", str(i)) for i in range(start, start + 25)
                                   for log in logs))

asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")))
"""


async def test_writer_processes_on_several_partitions_never_let_a_reader_skip_an_id(
    store: Store, store_db: str
) -> None:
    """Three processes add to three partitions at once (groups of 25 per partition); the
    reader of each partition sees every id once, in order, none appearing below one seen."""
    info = await store.add_stream("busy", 3)
    keys = ",".join(str(p.key) for p in info.partitions)
    count = 200
    writers = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", _WRITER, store_db, str(count), keys
        )
        for _ in range(3)
    ]
    logs = [store.partition_log(p) for p in info.partitions]
    seen: list[list[int]] = [[] for _ in logs]
    async with asyncio.timeout(120):
        while any(len(ids) < 3 * count for ids in seen):
            for log, ids in zip(logs, seen, strict=True):
                page = await log.read_events(ids[-1] if ids else 0, max_bytes=BIG)
                ids.extend(ids_of(page.json))
            await asyncio.sleep(0.001)  # pacing the reader only: it waits on the condition
        for writer in writers:
            assert await writer.wait() == 0
    for ids in seen:
        assert ids == list(range(1, 3 * count + 1))


# -- PostgreSQL only ---------------------------------------------------------------------------


@pytest.mark.postgres
async def test_commits_to_one_partition_are_ordered_and_others_do_not_wait(pg_url: str) -> None:
    """Forces the interleaving that breaks a bare sequence: an application's transaction
    draws id 1 of a partition and stays open; a server's append to that partition must not
    commit id 2 before it (a reader would pass 2, and 1 would appear later), while appends
    to another partition go through at once: no lock spans partitions."""
    import psycopg

    from futoin_evt.storage.postgres import add_event

    async with await open_store(pg_url) as store:
        info = await store.add_stream("pair", 2)
        first, second = (store.partition_log(p) for p in info.partitions)
        with psycopg.connect(pg_url) as app:
            assert add_event(app, "APP", 1, partition=info.partitions[0]) == 1
            waiting = asyncio.ensure_future(first.append("SRV", "2"))
            other = asyncio.ensure_future(second.append("OTHER", "1"))  # ready at once with it
            async with asyncio.timeout(30):
                assert await other == 1  # while the first partition waits
            await until(
                lambda: bool(
                    execute_sql(
                        pg_url, "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    )
                ),
                "the append waits for the partition's lock",
            )
            async with asyncio.timeout(30):
                assert await second.append("OTHER", "2") == 2  # still
            assert not waiting.done()
            assert (await first.read_events(0, max_bytes=BIG)).count == 0
            app.commit()
        async with asyncio.timeout(30):
            assert await waiting == 2
        assert ids_of((await first.read_events(0, max_bytes=BIG)).json) == [1, 2]


@pytest.mark.postgres
async def test_a_postgres_database_of_the_previous_release_opens_as_events_0(
    pg_url: str,
) -> None:
    """A database made by the migration steps of the release before streams (1 to 4, which
    stay in the code), with its data, opens with everything as events/0."""
    import psycopg

    pg_schema_at(pg_url, 4)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO events (type, data, ts, content_type) VALUES ('OLD', '1', 't', NULL),"
            " ('OLD', '2', 't', 'application/json'), ('Opened', '{}', 't', NULL)"
        )
        conn.execute("INSERT INTO dcb_events VALUES (3, 'dcb-1', '[\"acct:1\"]', false)")
        conn.execute("INSERT INTO event_tags VALUES ('acct:1', 3)")
        conn.execute(
            "INSERT INTO users (name, password_hash, created_at) VALUES ('olduser', 'h', 't')"
        )
        conn.execute(
            "INSERT INTO consumers (user_id, component, position, registered_at, last_seen_at,"
            " epoch) SELECT id, 'OLDC', 2, 't', 't', 5 FROM users"
        )
    async with await open_store(pg_url) as store:
        user = await store.get_user("olduser")
        assert user is not None
        assert await store.claim_consumer(user.id, "OLDC") == (6, 2)
        assert ids_of((await store.read_events(0, max_bytes=BIG)).json) == [1, 2, 3]
        assert (await store.read_rows(1, limit=1))[0][4] == "application/json"
        query = Query((QueryItem(tags=frozenset({"acct:1"})),))
        events, _ = await store.dcb_read(query, after=None, before=None, limit=9)
        assert [(e.position, e.id) for e in events] == [(3, "dcb-1")]
        assert await store.append("NEW", "1") == 4
        assert [s.name for s in await store.streams()] == ["events"]
    assert execute_sql(pg_url, "SELECT version FROM schema_version") == [(SCHEMA_VERSION,)]


@pytest.mark.postgres
async def test_a_claim_reaches_the_same_partition_in_another_process(pg_url: str) -> None:
    """The push stream that held a consumer of a partition, on another process, hears of its
    claim; the same consumer name on events/0 is another consumer and hears nothing."""
    async with await open_store(pg_url) as one, await open_store(pg_url) as other:
        info = await one.add_stream("claimed", 2)
        user = await one.add_user("u", "h")
        partition = info.partitions[1]
        await one.partition_log(partition).register_consumer(user, "C")
        heard: asyncio.Queue[tuple[int, str, int]] = asyncio.Queue()
        elsewhere: list[tuple[int, str, int]] = []
        other.partition_log(partition).claims.listen(lambda *claim: heard.put_nowait(claim))
        other.claims.listen(lambda *claim: elsewhere.append(claim))
        claimed = await one.partition_log(partition).claim_consumer(user, "C")
        assert claimed == (1, 0)
        async with asyncio.timeout(30):
            assert await heard.get() == (user, "C", 1)
        assert elsewhere == []
